/*
 * safetensors.h — a validating reader for Hugging Face safetensors files.
 *
 * Reads either `DIR/model.safetensors` or the shards named by
 * `DIR/model.safetensors.index.json` into one tensor_dir. Each file's JSON
 * header is parsed with cJSON; every offset is checked against the file's
 * data section, shapes against byte sizes, and duplicate names across shards
 * are refused. Errors name the file and the tensor.
 */
#ifndef SPARK_IO_SAFETENSORS_H
#define SPARK_IO_SAFETENSORS_H

#include "io/tensor_dir.h"

/* Load the tensors of the HF checkpoint directory `dir`: DIR/model.safetensors
 * if it exists, else the shards named by DIR/model.safetensors.index.json
 * (each loaded once; every tensor of the weight_map must be in its shard;
 * shard names must stay inside DIR), else SPARK_ERR_MISSING naming both.
 * On failure *out is zeroed. */
spark_status safetensors_open_dir(const char *dir, tensor_dir *out);
/* The same, holding the weight files as `opts` says (NULL = mapped). */
spark_status safetensors_open_dir_ex(const char *dir, const mapped_file_opts *opts, tensor_dir *out);

/* Load one .safetensors file, appending its tensors to `dir` (which may be
 * zeroed or already hold tensors from other shards); the dir takes the
 * mapping. A name already in `dir` is SPARK_ERR_FORMAT; a dtype other than
 * F32/F16/BF16, or more than 4 dimensions, is SPARK_ERR_UNSUPPORTED. On
 * failure `dir` is left exactly as it was. */
spark_status safetensors_append_file(const char *path, tensor_dir *dir);
spark_status safetensors_append_file_ex(const char *path, const mapped_file_opts *opts, tensor_dir *dir);

#endif
