/*
 * page.c — the chat page served at `/`, embedded in the binary.
 *
 * The page is kept as plain HTML + JS in chat_page.html so it can be edited
 * and viewed as a file; the assembler's .incbin copies it into .rodata at
 * build time (the Makefile makes page.o depend on the .html), so there is no
 * generated source and no build step beyond the compiler.
 */
#include "server/server.h"

__asm__(".section .rodata\n"
        ".global chat_page_html\n"
        ".type chat_page_html, @object\n"
        ".balign 16\n"
        "chat_page_html:\n"
        ".incbin \"src/server/chat_page.html\"\n"
        "chat_page_end:\n"
        ".byte 0\n"
        ".previous\n");

extern const char chat_page_end[];

size_t chat_page_len(void) { return (size_t)(chat_page_end - chat_page_html); }
