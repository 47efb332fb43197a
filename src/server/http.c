/*
 * http.c — the HTTP side of `spark serve`, on libmicrohttpd.
 *
 * libmicrohttpd runs one thread per connection, so a handler may block: a
 * non-streamed generation waits for its job inside the access handler, and a
 * streamed one waits inside the response's content reader. Both wait in
 * short slices and poll the client's socket in between (POLLRDHUP), so a
 * client that hangs up while its request is queued or generating cancels it
 * at once; a client that vanishes while bytes are flowing makes the write
 * fail, and the request-completed callback cancels the job instead.
 *
 * Requests are answered only once their body is fully read (or discarded):
 * answering early makes the server close a socket with unread data, which
 * resets the connection before the client reads the error. Bodies above the
 * limit are discarded as they arrive and answered with 413.
 */
#include "server/server.h"

#include <microhttpd.h>

#include <arpa/inet.h>
#include <ctype.h>
#include <netdb.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { WAIT_SLICE_MS = 100, IDLE_TIMEOUT_S = 120, MAX_CONNECTIONS = 512 };

typedef struct request {
    server *srv;
    endpoint ep;
    int early_status; /* decided from the headers: 401, 404, 405 */
    const char *allow; /* for 405 */
    sbuf body;
    int too_large;
    size_t discarded;
    job *job; /* the connection's reference to its generation */
} request;

typedef struct stream_ctx {
    server *srv;
    job *job; /* the response's own reference */
    int fd;
} stream_ctx;

/* ---- sending ------------------------------------------------------------------ */

static enum MHD_Result send_body(request *r, struct MHD_Connection *conn, int status, const char *ctype,
                                 const char *body, size_t len)
{
    struct MHD_Response *resp = MHD_create_response_from_buffer(len, (void *)body, MHD_RESPMEM_MUST_COPY);
    if (!resp) return MHD_NO;
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, ctype);
    if (status == MHD_HTTP_UNAUTHORIZED) MHD_add_response_header(resp, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer");
    if (status == MHD_HTTP_METHOD_NOT_ALLOWED && r->allow) MHD_add_response_header(resp, MHD_HTTP_HEADER_ALLOW, r->allow);
    if (status == MHD_HTTP_SERVICE_UNAVAILABLE) MHD_add_response_header(resp, MHD_HTTP_HEADER_RETRY_AFTER, "1");
    enum MHD_Result ret = MHD_queue_response(conn, (unsigned)status, resp);
    MHD_destroy_response(resp);
    metrics_request(r->srv->metrics, r->ep, status);
    return ret;
}

static enum MHD_Result send_json(request *r, struct MHD_Connection *conn, int status, char *json)
{
    if (!json) return MHD_NO; /* out of memory: drop the connection */
    enum MHD_Result ret = send_body(r, conn, status, "application/json", json, strlen(json));
    free(json);
    return ret;
}

static const char *error_type(int status)
{
    switch (status) {
    case 401: return "authentication_error";
    case 404: return "not_found_error";
    case 503: return "server_error";
    default: return status >= 500 ? "server_error" : "invalid_request_error";
    }
}

static enum MHD_Result send_error(request *r, struct MHD_Connection *conn, int status, const char *code,
                                  const char *fmt, ...)
{
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return send_json(r, conn, status, output_error_json(msg, error_type(status), NULL, code));
}

static enum MHD_Result send_api_error(request *r, struct MHD_Connection *conn, const api_error *e)
{
    return send_json(r, conn, e->status, output_error_json(e->message, e->type, e->param[0] ? e->param : NULL, e->code));
}

/* ---- waiting on a job ------------------------------------------------------------ */

static int connection_fd(struct MHD_Connection *conn)
{
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    return ci ? ci->connect_fd : -1;
}

/* Has the peer closed its side or reset the connection? */
static int client_gone(int fd)
{
    if (fd < 0) return 0;
    struct pollfd p = {.fd = fd, .events = POLLRDHUP};
    if (poll(&p, 1, 0) <= 0) return 0;
    return (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0;
}

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    stream_ctx *sc = cls;
    (void)pos;
    for (;;) {
        long n = job_take(sc->job, buf, max);
        if (n > 0) return n;
        if (n < 0) return MHD_CONTENT_READER_END_OF_STREAM;
        if (!job_wait(sc->job, WAIT_SLICE_MS) && client_gone(sc->fd)) {
            sched_abandon(sc->srv->sched, sc->job);
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
    }
}

static void stream_free(void *cls)
{
    stream_ctx *sc = cls;
    job_unref(sc->job);
    free(sc);
}

static enum MHD_Result send_stream(request *r, struct MHD_Connection *conn, job *j)
{
    stream_ctx *sc = calloc(1, sizeof *sc);
    if (!sc) return MHD_NO;
    sc->srv = r->srv;
    sc->job = j;
    sc->fd = connection_fd(conn);
    job_ref(j);
    struct MHD_Response *resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, stream_read, sc, stream_free);
    if (!resp) {
        stream_free(sc);
        return MHD_NO;
    }
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    MHD_add_response_header(resp, "X-Accel-Buffering", "no");
    enum MHD_Result ret = MHD_queue_response(conn, MHD_HTTP_OK, resp);
    MHD_destroy_response(resp);
    metrics_request(r->srv->metrics, r->ep, MHD_HTTP_OK);
    return ret;
}

/* Block until the job is done; 0 when the client left first. */
static int wait_done(server *srv, job *j, int fd)
{
    for (;;) {
        pthread_mutex_lock(&j->lock);
        int done = j->done;
        pthread_mutex_unlock(&j->lock);
        if (done) return 1;
        if (!job_wait(j, WAIT_SLICE_MS) && client_gone(fd)) {
            sched_abandon(srv->sched, j);
            return 0;
        }
    }
}

static enum MHD_Result send_finished(request *r, struct MHD_Connection *conn, job *j)
{
    if (j->err_status)
        return send_error(r, conn, j->err_status == 499 ? 503 : j->err_status, NULL, "%s",
                          j->err_msg ? j->err_msg : "generation failed");
    return send_json(r, conn, MHD_HTTP_OK, output_response(j));
}

/* ---- endpoints ------------------------------------------------------------------- */

static enum MHD_Result do_generate(request *r, struct MHD_Connection *conn, job_kind kind)
{
    server *srv = r->srv;
    api_error e;
    job *j = request_parse(srv, kind, r->body.p ? r->body.p : "", r->body.n, &e);
    if (!j) return send_api_error(r, conn, &e);
    int rc = sched_submit(srv->sched, j);
    if (rc != 0) {
        job_unref(j);
        if (rc == -2) return send_error(r, conn, 503, "shutting_down", "The server is shutting down.");
        metrics_rejected(srv->metrics);
        int sessions, active, queued, cap;
        sched_stats(srv->sched, &sessions, &active, &queued, &cap);
        return send_error(r, conn, 503, "server_busy",
                          "The server is busy: all %d sessions are in use and the queue of %d is full. Try again "
                          "later.", sessions, cap);
    }
    r->job = j;
    __atomic_add_fetch(&srv->inflight, 1, __ATOMIC_SEQ_CST);
    /* the wait for a queued or long job must not count as an idle connection;
     * client_gone() watches the socket meanwhile */
    MHD_set_connection_option(conn, MHD_CONNECTION_OPTION_TIMEOUT, 0u);
    if (j->stream) return send_stream(r, conn, j);
    if (!wait_done(srv, j, connection_fd(conn))) return MHD_NO;
    MHD_set_connection_option(conn, MHD_CONNECTION_OPTION_TIMEOUT, (unsigned)IDLE_TIMEOUT_S);
    return send_finished(r, conn, j);
}

static enum MHD_Result do_models(request *r, struct MHD_Connection *conn, const char *url)
{
    const char *id = strncmp(url, "/v1/models/", 11) ? NULL : url + 11;
    char *json = models_json(r->srv, id);
    if (!json && id) return send_error(r, conn, 404, "model_not_found", "The model '%.200s' does not exist", id);
    return send_json(r, conn, MHD_HTTP_OK, json);
}

static enum MHD_Result respond(request *r, struct MHD_Connection *conn, const char *url, const char *method)
{
    if (r->early_status == 401)
        return send_error(r, conn, 401, "invalid_api_key", "Incorrect or missing API key: send 'Authorization: Bearer KEY'.");
    if (r->early_status == 404) return send_error(r, conn, 404, "not_found", "Invalid URL (%s %.200s)", method, url);
    if (r->early_status == 405)
        return send_error(r, conn, 405, "method_not_allowed", "Method %s is not allowed on %.200s (allowed: %s)", method,
                          url, r->allow);
    if (r->too_large)
        return send_error(r, conn, 413, "request_too_large", "The request body exceeds the limit of %zu bytes",
                          r->srv->cfg.max_body);
    switch (r->ep) {
    case EP_PAGE: return send_body(r, conn, 200, "text/html; charset=utf-8", chat_page_html, chat_page_len());
    case EP_HEALTH: return send_json(r, conn, 200, health_json(r->srv));
    case EP_MODELS: return do_models(r, conn, url);
    case EP_CHAT: return do_generate(r, conn, JOB_CHAT);
    case EP_COMPLETIONS: return do_generate(r, conn, JOB_COMPLETION);
    case EP_METRICS: {
        char *text = metrics_text(r->srv);
        if (!text) return MHD_NO;
        enum MHD_Result ret = send_body(r, conn, 200, "text/plain; version=0.0.4; charset=utf-8", text, strlen(text));
        free(text);
        return ret;
    }
    default: return send_error(r, conn, 404, "not_found", "Invalid URL (%s %.200s)", method, url);
    }
}

/* ---- routing and auth -------------------------------------------------------------- */

typedef struct route {
    const char *path;
    int prefix; /* path is a prefix (/v1/models/ID) */
    endpoint ep;
    const char *method; /* GET or POST */
    int auth;
} route;

static const route routes[] = {
    {"/", 0, EP_PAGE, "GET", 0},
    {"/health", 0, EP_HEALTH, "GET", 0},
    {"/metrics", 0, EP_METRICS, "GET", 1},
    {"/v1/models", 0, EP_MODELS, "GET", 1},
    {"/v1/models/", 1, EP_MODELS, "GET", 1},
    {"/v1/chat/completions", 0, EP_CHAT, "POST", 1},
    {"/v1/completions", 0, EP_COMPLETIONS, "POST", 1},
};

static const route *find_route(const char *url)
{
    for (size_t i = 0; i < sizeof routes / sizeof routes[0]; i++) {
        const route *rt = &routes[i];
        if (rt->prefix ? !strncmp(url, rt->path, strlen(rt->path)) && url[strlen(rt->path)] : !strcmp(url, rt->path))
            return rt;
    }
    return NULL;
}

/* Compare in time independent of where the strings differ. */
static int key_matches(const char *given, const char *key)
{
    size_t a = strlen(given), b = strlen(key);
    unsigned diff = a != b;
    for (size_t i = 0; i < b; i++) diff |= (unsigned char)key[i] ^ (unsigned char)(i < a ? given[i] : 0);
    return diff == 0;
}

static int authorized(server *srv, struct MHD_Connection *conn)
{
    if (!srv->cfg.api_key) return 1;
    const char *h = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    if (!h || strncasecmp(h, "Bearer ", 7)) return 0;
    h += 7;
    while (*h == ' ') h++;
    return key_matches(h, srv->cfg.api_key);
}

static void classify(request *r, struct MHD_Connection *conn, const char *url, const char *method)
{
    const route *rt = find_route(url);
    r->ep = rt ? rt->ep : EP_OTHER;
    if (!rt) {
        r->early_status = 404;
        return;
    }
    int is_get = !strcmp(method, "GET") || !strcmp(method, "HEAD");
    if (!(is_get ? !strcmp(rt->method, "GET") : !strcmp(method, rt->method))) {
        r->early_status = 405;
        r->allow = rt->method;
        return;
    }
    if (rt->auth && !authorized(r->srv, conn)) r->early_status = 401;
}

/* ---- libmicrohttpd callbacks --------------------------------------------------------- */

static void take_upload(request *r, const char *data, size_t n)
{
    size_t limit = r->srv->cfg.max_body;
    if (r->early_status || r->too_large) {
        r->discarded += n;
    } else if (r->body.n + n > limit || sbuf_add(&r->body, data, n)) {
        r->too_large = 1;
        r->discarded = r->body.n + n;
        sbuf_free(&r->body);
    }
}

static enum MHD_Result on_access(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
                                 const char *version, const char *upload_data, size_t *upload_size, void **con_cls)
{
    server *srv = cls;
    request *r = *con_cls;
    (void)version;
    if (!r) {
        if (!(r = calloc(1, sizeof *r))) return MHD_NO;
        r->srv = srv;
        *con_cls = r;
        classify(r, conn, url, method);
        return MHD_YES;
    }
    if (*upload_size) {
        take_upload(r, upload_data, *upload_size);
        *upload_size = 0;
        /* reading a refused body is polite up to a point; past it, hang up */
        return r->discarded > 64 * srv->cfg.max_body + (1u << 20) ? MHD_NO : MHD_YES;
    }
    return respond(r, conn, url, method);
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls, enum MHD_RequestTerminationCode toe)
{
    server *srv = cls;
    request *r = *con_cls;
    if (!r) return;
    if (r->job) {
        pthread_mutex_lock(&r->job->lock);
        int done = r->job->done;
        pthread_mutex_unlock(&r->job->lock);
        if (!done) sched_abandon(srv->sched, r->job); /* the connection ended first */
        job_unref(r->job);
        __atomic_sub_fetch(&srv->inflight, 1, __ATOMIC_SEQ_CST);
        /* generation turned the idle timeout off; the connection may live on */
        if (toe == MHD_REQUEST_TERMINATED_COMPLETED_OK)
            MHD_set_connection_option(conn, MHD_CONNECTION_OPTION_TIMEOUT, (unsigned)IDLE_TIMEOUT_S);
    }
    sbuf_free(&r->body);
    free(r);
    *con_cls = NULL;
}

static void on_mhd_log(void *cls, const char *fmt, va_list ap)
{
    (void)cls;
    /* our own content reader ends a stream this way when its client hung
     * up; run.c already logs that generation as cancelled */
    if (!strncmp(fmt, "Closing connection (application error", 38)) return;
    fputs("spark serve: http: ", stderr);
    vfprintf(stderr, fmt, ap);
}

/* ---- start / stop ---------------------------------------------------------------------- */

static int resolve(const char *host, int port, struct sockaddr_storage *addr, int *ipv6)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE}, *res;
    char service[16];
    snprintf(service, sizeof service, "%d", port);
    int rc = getaddrinfo(host, service, &hints, &res);
    if (rc != 0) {
        fprintf(stderr, "spark serve: cannot resolve --host %s: %s\n", host, gai_strerror(rc));
        return -1;
    }
    memcpy(addr, res->ai_addr, res->ai_addrlen);
    *ipv6 = res->ai_family == AF_INET6;
    freeaddrinfo(res);
    return 0;
}

int http_start(server *srv)
{
    struct sockaddr_storage addr;
    int ipv6 = 0;
    if (resolve(srv->cfg.host, srv->cfg.port, &addr, &ipv6)) return -1;
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL |
                     MHD_USE_ERROR_LOG | MHD_USE_ITC | (ipv6 ? MHD_USE_IPv6 : 0);
    srv->daemon = MHD_start_daemon(flags, (uint16_t)srv->cfg.port, NULL, NULL, on_access, srv,
                                   MHD_OPTION_EXTERNAL_LOGGER, on_mhd_log, NULL,
                                   MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&addr,
                                   MHD_OPTION_NOTIFY_COMPLETED, on_completed, srv,
                                   MHD_OPTION_CONNECTION_LIMIT, (unsigned)MAX_CONNECTIONS,
                                   MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)IDLE_TIMEOUT_S,
                                   MHD_OPTION_END);
    if (!srv->daemon) {
        fprintf(stderr, "spark serve: cannot listen on %s:%d (in use, or not an address of this machine?)\n",
                srv->cfg.host, srv->cfg.port);
        return -1;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(srv->daemon, MHD_DAEMON_INFO_BIND_PORT);
    srv->port = di ? di->port : srv->cfg.port;
    return 0;
}

void http_quiesce(server *srv)
{
    if (!srv->daemon) return;
    MHD_socket fd = MHD_quiesce_daemon(srv->daemon);
    if (fd != MHD_INVALID_SOCKET) close(fd);
}

void http_drain(server *srv, int timeout_ms)
{
    for (int waited = 0; waited < timeout_ms && __atomic_load_n(&srv->inflight, __ATOMIC_SEQ_CST) > 0; waited += 10)
        usleep(10 * 1000);
}

void http_stop(server *srv)
{
    if (srv->daemon) MHD_stop_daemon(srv->daemon);
    srv->daemon = NULL;
}
