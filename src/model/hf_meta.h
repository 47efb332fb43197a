/*
 * hf_meta.h — the GGUF metadata of a Hugging Face spark2_5 checkpoint: the
 * `spark2_5.*` hyper-parameters (SPEC §4) from its parsed config, and the
 * `tokenizer.*` keys from tokenizer.json (+ tokenizer_config.json or
 * chat_template.jinja), the same keys tools/sparkgguf.py writes.
 */
#ifndef SPARK_MODEL_HF_META_H
#define SPARK_MODEL_HF_META_H

#include "io/gguf_write.h"
#include "model/model.h"

/* Write general.architecture / name / file_type, the hyper-parameters and,
 * when dir holds a tokenizer.json, the tokenizer keys. Errors name the file. */
spark_status hf_meta_write(gguf_writer *w, const spark_model *m, const char *dir, uint32_t file_type);

#endif
