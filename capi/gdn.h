/*
 * gdn.h - libgdn's stable C ABI.
 *
 * libgdn runs Gated DeltaNet hybrid language models (Qwen3.5 / Qwen3.6 dense, Qwen3-Next style)
 * from unmodified Hugging Face checkpoints. This header is the whole binary contract of the shared
 * library libgdn.so; it is C99 and compiles unchanged as C++.
 *
 *   gdn_model *model;  gdn_context *ctx;  gdn_batch *batch;  gdn_seq_id seq;
 *   if (gdn_model_load("path/to/checkpoint", NULL, &model) != GDN_STATUS_OK)
 *       fprintf(stderr, "%s\n", gdn_last_error());
 *   gdn_context_params cp = gdn_context_default_params();
 *   cp.max_sequences = 8;
 *   gdn_context_create(model, &cp, &ctx);
 *   gdn_seq_create(ctx, &seq);
 *   gdn_batch_init(8, 512, &batch);
 *   gdn_batch_add(batch, seq, prompt, n_prompt, GDN_LOGITS_LAST, 0, &row);
 *   gdn_context_step(ctx, batch);
 *   gdn_context_get_logits(ctx, row, &logits);        // vocab_size floats, valid until the next step
 *
 * Conventions
 *   - Handles (gdn_model, gdn_context, gdn_batch) are opaque. A NULL or foreign handle is refused
 *     with GDN_STATUS_INVALID_ARGUMENT; the *_free functions accept NULL and do nothing.
 *   - Every call that can fail returns a gdn_status. On failure, gdn_last_error() gives a
 *     human-readable message naming the function and the offending value; it is per thread and
 *     stays valid until the next status-returning call on that thread, which clears it on success.
 *     Output parameters are written only on success. No C++ exception ever crosses this boundary.
 *   - A gdn_model is immutable and may be shared by any number of threads and contexts. A
 *     gdn_context (and a gdn_batch) is used by one thread at a time.
 *   - A context keeps its model alive: gdn_model_free may come before gdn_context_free.
 *
 * Versioning (ABI rule)
 *   GDN_ABI_VERSION changes only on a break: a function removed or its signature or meaning changed,
 *   a struct field moved, retyped or removed, an enum value renumbered. It is the shared library's
 *   SONAME (libgdn.so.GDN_ABI_VERSION), so a binary never loads a library it cannot talk to.
 *   Everything else is an addition that keeps the ABI version:
 *     - new functions (the exported symbol list only grows; a test checks it),
 *     - new enum values (appended; a retired value is never reused),
 *     - new fields appended to a struct that starts with `uint32_t size`, placed after the previous
 *       version's sizeof, and whose value 0 means "as before this field existed".
 *   Every struct passed across the boundary starts with `uint32_t size`, which the caller sets to
 *   sizeof the struct it was compiled with (the *_default_params() helpers below do it). The library
 *     - refuses a size below the first version's (or absurdly large) with GDN_STATUS_INVALID_ARGUMENT,
 *     - reads an older (smaller) struct's fields and uses defaults for the fields it lacks,
 *     - accepts a newer (larger) struct only when every byte past its own sizeof is zero, i.e. the
 *       caller left the fields this older library does not know at "as before"; otherwise it refuses
 *       with GDN_STATUS_INVALID_ARGUMENT rather than silently ignore an option,
 *     - fills output structs (gdn_model_config, gdn_context_memory) up to min(size, its sizeof) and
 *       zeroes the rest.
 *   Parameter structs are never returned by value from the library: a by-value return writes the
 *   library's sizeof into a caller's smaller buffer after an upgrade. gdn_*_default_params() are
 *   static inline here, compiled into the caller with the caller's sizeof, and call the exported
 *   gdn_*_params_init(). (From ctypes, set .size and call the _init function.)
 */
#ifndef GDN_H
#define GDN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#if defined(_WIN32)
#  if defined(GDN_BUILDING_SHARED)
#    define GDN_API __declspec(dllexport)
#  elif defined(GDN_SHARED)
#    define GDN_API __declspec(dllimport)
#  else
#    define GDN_API
#  endif
#elif defined(__GNUC__) || defined(__clang__)
#  define GDN_API __attribute__((visibility("default")))
#else
#  define GDN_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ABI version of this header; compare with gdn_abi_version() (see "Versioning" above). */
#define GDN_ABI_VERSION 1

/* ------------------------------------------------------------------------------------------ */
/* Status codes. Values equal gdn::Status (include/gdn/core/error.hpp) and are part of the ABI:
 * never renumbered, never reused. */
typedef enum gdn_status {
    GDN_STATUS_OK = 0,
    GDN_STATUS_INVALID_ARGUMENT = 1,    /* a parameter is out of range or inconsistent; NULL handle; wrong-size struct */
    GDN_STATUS_IO_ERROR = 2,            /* a file could not be opened, mapped or read */
    GDN_STATUS_INVALID_FILE = 3,        /* a file's bytes are malformed or truncated (safetensors, json) */
    GDN_STATUS_UNSUPPORTED_MODEL = 4,   /* the config names an architecture or feature libgdn does not run */
    GDN_STATUS_MISSING_TENSOR = 5,      /* a tensor the config implies is absent from the checkpoint */
    GDN_STATUS_TENSOR_MISMATCH = 6,     /* a tensor's dtype or shape is not what the config implies */
    GDN_STATUS_OUT_OF_CAPACITY = 7,     /* sequence slots, KV pages, scratch or memory exhausted */
    GDN_STATUS_INVALID_SEQUENCE = 8,    /* a sequence id is stale, freed or never existed */
    GDN_STATUS_CONTEXT_OVERFLOW = 9,    /* a sequence would grow past the context's max_context */
    GDN_STATUS_INVALID_TOKEN = 10,      /* a token id outside [0, vocab_size) */
    GDN_STATUS_BACKEND_UNAVAILABLE = 11, /* the requested backend was not built or has no device */
    GDN_STATUS_INTERNAL = 12            /* a bug in libgdn; please report it */
} gdn_status;

typedef int32_t gdn_token;
/* A sequence handle. A handle to a freed slot is refused (GDN_STATUS_INVALID_SEQUENCE), even after
 * the slot is reused by a new sequence. */
typedef uint64_t gdn_seq_id;

typedef struct gdn_model gdn_model;
typedef struct gdn_context gdn_context;
typedef struct gdn_batch gdn_batch;

/* Recurrent (GDN) state element type. DEFAULT follows the checkpoint's mamba_ssm_dtype (float32). */
typedef enum gdn_state_dtype {
    GDN_STATE_DTYPE_DEFAULT = 0,
    GDN_STATE_DTYPE_F32 = 1,
    GDN_STATE_DTYPE_BF16 = 2
} gdn_state_dtype;

/* Values equal gdn::Backend. */
typedef enum gdn_backend {
    GDN_BACKEND_CPU = 0,
    GDN_BACKEND_CUDA = 1
} gdn_backend;

/* Which positions of a batch entry produce logits. Values equal gdn::LogitsFor. */
typedef enum gdn_logits_mode {
    GDN_LOGITS_NONE = 0,
    GDN_LOGITS_LAST = 1,
    GDN_LOGITS_ALL = 2
} gdn_logits_mode;

/* ------------------------------------------------------------------------------------------ */
/* Library */

/* The ABI version the library was built with (GDN_ABI_VERSION of its header). */
GDN_API uint32_t gdn_abi_version(void);
/* The library's release, "MAJOR.MINOR.PATCH". */
GDN_API const char *gdn_version_string(void);
/* A status's name ("ok", "invalid_argument", ...); "unknown" for a value this library lacks. */
GDN_API const char *gdn_status_string(gdn_status status);
/* The message of this thread's last failed call; "" after a successful one. Never NULL. */
GDN_API const char *gdn_last_error(void);

/* ------------------------------------------------------------------------------------------ */
/* Model */

typedef struct gdn_model_params {
    uint32_t size;     /* sizeof(gdn_model_params) */
    bool load_mtp;     /* bind the checkpoint's multi-token-prediction head when it has one (default true) */
} gdn_model_params;

/* Fills *params with defaults; params->size must be set. INVALID_ARGUMENT: NULL or wrong size. */
GDN_API gdn_status gdn_model_params_init(gdn_model_params *params);

static inline gdn_model_params gdn_model_default_params(void) {
    gdn_model_params p;
    p.size = (uint32_t)sizeof p;
    (void)gdn_model_params_init(&p);
    return p;
}

/* Loads a Hugging Face checkpoint directory (config.json + model.safetensors or a sharded index),
 * memory-mapped; every tensor the config implies is checked for presence, dtype and shape first.
 * params may be NULL (defaults).
 * Returns OK, INVALID_ARGUMENT, IO_ERROR, INVALID_FILE, UNSUPPORTED_MODEL, MISSING_TENSOR or
 * TENSOR_MISMATCH. */
GDN_API gdn_status gdn_model_load(const char *path, const gdn_model_params *params, gdn_model **out_model);

/* Releases the caller's reference; contexts created from the model keep it alive. NULL: no-op. */
GDN_API void gdn_model_free(gdn_model *model);

/* The text model's configuration. Strings and arrays point into the model and stay valid until
 * gdn_model_free. */
typedef struct gdn_model_config {
    uint32_t size;                         /* set by the caller: sizeof(gdn_model_config) */
    int32_t vocab_size;
    int32_t hidden_size;
    int32_t intermediate_size;
    int32_t num_layers;
    int32_t num_linear_attention_layers;   /* Gated DeltaNet layers */
    int32_t num_full_attention_layers;     /* gated softmax-attention layers */
    int32_t num_attention_heads;
    int32_t num_key_value_heads;
    int32_t head_dim;
    int32_t rotary_dim;
    int32_t linear_num_key_heads;
    int32_t linear_num_value_heads;
    int32_t linear_key_head_dim;
    int32_t linear_value_head_dim;
    int32_t linear_conv_kernel_dim;
    int32_t mtp_num_hidden_layers;
    int32_t max_position_embeddings;
    bool tie_word_embeddings;
    bool has_mtp;                          /* the MTP head is loaded (gdn_context_step_mtp works) */
    float rms_norm_eps;
    double rope_theta;
    gdn_state_dtype state_dtype;           /* the checkpoint's recurrent-state dtype (F32 or BF16) */
    int32_t n_eos_token_ids;
    const gdn_token *eos_token_ids;        /* n_eos_token_ids ids */
    const char *architecture;              /* architectures[0], e.g. "Qwen3_5ForConditionalGeneration" */
    const char *model_type;                /* of the text model, e.g. "qwen3_5_text" */
} gdn_model_config;

/* Fills *out_config (out_config->size must be set). INVALID_ARGUMENT: NULL or wrong size. */
GDN_API gdn_status gdn_model_get_config(const gdn_model *model, gdn_model_config *out_config);

/* ------------------------------------------------------------------------------------------ */
/* Context: the mutable state of up to max_sequences sequences, all allocated at creation. */

typedef struct gdn_context_params {
    uint32_t size;                 /* sizeof(gdn_context_params) */
    int32_t max_sequences;         /* sequence slots (default 4) */
    int32_t max_context;           /* positions per sequence (default 4096) */
    int32_t kv_page_size;          /* positions per KV page (default 16) */
    int64_t kv_pages;              /* 0: enough for every slot to reach max_context */
    int32_t max_batch_tokens;      /* rows per pass through the layers; larger steps are split (256) */
    int32_t max_logits_rows;       /* 0: max(max_sequences, 64); a larger step grows the buffer */
    gdn_state_dtype state_dtype;   /* recurrent state dtype (default: the checkpoint's, float32) */
    int32_t threads;               /* 0: one per hardware thread */
    int32_t gdn_chunk_min_tokens;  /* a sequence advancing by at least this many tokens takes chunked GDN (16) */
    int32_t max_rollback_tokens;   /* > 0: a step of up to this many tokens per sequence can be partly undone (0) */
    gdn_backend backend;           /* GDN_BACKEND_CPU */
} gdn_context_params;

/* Fills *params with defaults; params->size must be set. INVALID_ARGUMENT: NULL or wrong size. */
GDN_API gdn_status gdn_context_params_init(gdn_context_params *params);

static inline gdn_context_params gdn_context_default_params(void) {
    gdn_context_params p;
    p.size = (uint32_t)sizeof p;
    (void)gdn_context_params_init(&p);
    return p;
}

/* Creates a context for `model`; params may be NULL (defaults).
 * Returns OK, INVALID_ARGUMENT, OUT_OF_CAPACITY (memory) or BACKEND_UNAVAILABLE. */
GDN_API gdn_status gdn_context_create(gdn_model *model, const gdn_context_params *params, gdn_context **out_ctx);

/* Frees the context and all its sequences. NULL: no-op. */
GDN_API void gdn_context_free(gdn_context *ctx);

typedef struct gdn_context_memory {
    uint32_t size;                          /* set by the caller: sizeof(gdn_context_memory) */
    int32_t live_sequences;                 /* slots in use */
    int64_t gdn_state_bytes_per_sequence;   /* conv + recurrent state of all GDN layers, one slot */
    int64_t kv_bytes_per_token;             /* KV cache of all attention layers (and MTP), one position */
    int64_t kv_free_pages;                  /* pages not held by any sequence */
    int64_t snapshot_bytes;                 /* GDN state copied by one snapshot or fork */
    int64_t rollback_bytes_per_sequence;    /* memory max_rollback_tokens costs per slot */
} gdn_context_memory;

/* Fills *out_memory (out_memory->size must be set). */
GDN_API gdn_status gdn_context_get_memory(const gdn_context *ctx, gdn_context_memory *out_memory);

/* ------------------------------------------------------------------------------------------ */
/* Sequences */

/* Takes a free slot. OUT_OF_CAPACITY when all max_sequences are live. */
GDN_API gdn_status gdn_seq_create(gdn_context *ctx, gdn_seq_id *out_seq);
/* Clears all state: the sequence then behaves exactly like a freshly created one. */
GDN_API gdn_status gdn_seq_reset(gdn_context *ctx, gdn_seq_id seq);
/* Frees the slot; the handle becomes invalid (INVALID_SEQUENCE from then on). */
GDN_API gdn_status gdn_seq_free(gdn_context *ctx, gdn_seq_id seq);
/* Positions consumed by the main model. */
GDN_API gdn_status gdn_seq_length(const gdn_context *ctx, gdn_seq_id seq, int64_t *out_length);
/* Positions consumed by the MTP layer. */
GDN_API gdn_status gdn_seq_mtp_length(const gdn_context *ctx, gdn_seq_id seq, int64_t *out_length);
/* Whether `seq` is a live sequence of `ctx` (false for a NULL context). */
GDN_API bool gdn_seq_is_valid(const gdn_context *ctx, gdn_seq_id seq);

/* Exact state control. Unlike a KV-only cache, a Gated DeltaNet sequence's recurrent state cannot
 * be cut back by dropping positions; these calls make every such move exact (bit-identical to a
 * sequence that only ever saw the kept tokens). */
typedef uint64_t gdn_snapshot_id;

/* Saves the sequence's state in the context (GDN states copied, KV pages shared copy-on-write). */
GDN_API gdn_status gdn_seq_snapshot(gdn_context *ctx, gdn_seq_id seq, gdn_snapshot_id *out_snapshot);
GDN_API gdn_status gdn_snapshot_free(gdn_context *ctx, gdn_snapshot_id snapshot);
/* Puts `seq` exactly where the snapshot was taken. */
GDN_API gdn_status gdn_seq_restore(gdn_context *ctx, gdn_seq_id seq, gdn_snapshot_id snapshot);
/* A new sequence starting from the snapshot (prefix reuse). */
GDN_API gdn_status gdn_seq_create_from(gdn_context *ctx, gdn_snapshot_id snapshot, gdn_seq_id *out_seq);
/* A new sequence identical to `seq` now. */
GDN_API gdn_status gdn_seq_fork(gdn_context *ctx, gdn_seq_id seq, gdn_seq_id *out_seq);
/* Keeps the first `keep` of the tokens the sequence's last step gave it (needs
 * max_rollback_tokens >= that step's tokens). */
GDN_API gdn_status gdn_seq_rollback(gdn_context *ctx, gdn_seq_id seq, int64_t keep);
/* Tokens of the last step that gdn_seq_rollback can still undo (0 when it cannot). */
GDN_API gdn_status gdn_seq_rollbackable_tokens(const gdn_context *ctx, gdn_seq_id seq, int64_t *out_tokens);
/* Cuts the MTP layer's positions back to mtp_length (exact: it keeps only KV). */
GDN_API gdn_status gdn_seq_truncate_mtp(gdn_context *ctx, gdn_seq_id seq, int64_t mtp_length);
/* Writes the sequence's full state to a file (versioned, checksummed, tied to the model's shapes,
 * written atomically); gdn_seq_load restores it into a new sequence. */
GDN_API gdn_status gdn_seq_save(const gdn_context *ctx, gdn_seq_id seq, const char *path);
GDN_API gdn_status gdn_seq_load(gdn_context *ctx, const char *path, gdn_seq_id *out_seq);

/* ------------------------------------------------------------------------------------------ */
/* Batch: which sequences advance by which tokens in one step, and which positions want logits.
 * The host owns batching: one step may mix a long prompt for one sequence with single decode
 * tokens for others. Positions are implicit: a sequence continues where it stands. */

/* Creates an empty batch; the reserve sizes are hints (the batch grows as needed). */
GDN_API gdn_status gdn_batch_init(int32_t reserve_entries, int64_t reserve_tokens, gdn_batch **out_batch);
GDN_API void gdn_batch_free(gdn_batch *batch);
GDN_API gdn_status gdn_batch_clear(gdn_batch *batch);

/* Flags of gdn_batch_add (bits; a bit this library does not know is refused). */
enum {
    /* An output row for every token of the entry, carrying its final hidden state (what the MTP
     * head reads); logits are still computed only where the logits mode asks. */
    GDN_BATCH_HIDDEN_ALL = 1u << 0
};

/* Appends n_tokens tokens for `seq`. The entry's output rows are consecutive: one per token with
 * GDN_LOGITS_ALL or GDN_BATCH_HIDDEN_ALL, otherwise a single row for the last token (LAST) or none
 * (NONE). out_first_row (may be NULL) receives the first of them, or -1 when there are none; the
 * last token's row is then out_first_row + n_tokens - 1 when there is a row per token.
 * Sequence ids, token ids and repeats (a sequence appears at most once per batch) are checked by
 * gdn_context_step. */
GDN_API gdn_status gdn_batch_add(gdn_batch *batch, gdn_seq_id seq, const gdn_token *tokens, int64_t n_tokens,
                                 gdn_logits_mode logits, uint32_t flags, int64_t *out_first_row);

/* Tokens and output rows the batch holds (either pointer may be NULL). */
GDN_API gdn_status gdn_batch_size(const gdn_batch *batch, int64_t *out_tokens, int64_t *out_output_rows);

/* ------------------------------------------------------------------------------------------ */
/* Step */

/* Advances every sequence in the batch by its tokens. The whole batch is validated first; on
 * error nothing has changed. Returns OK, INVALID_ARGUMENT, INVALID_SEQUENCE, INVALID_TOKEN,
 * CONTEXT_OVERFLOW or OUT_OF_CAPACITY. */
GDN_API gdn_status gdn_context_step(gdn_context *ctx, const gdn_batch *batch);

/* Runs the multi-token-prediction head: for batch token i, hidden row i (hidden_size floats) is the
 * main model's post-norm hidden state of the position before that token (gdn_context_get_hidden).
 * n_hidden_rows must equal the batch's token count. Its outputs replace the last step's.
 * UNSUPPORTED_MODEL when the model has no MTP head. */
GDN_API gdn_status gdn_context_step_mtp(gdn_context *ctx, const gdn_batch *batch, const float *hidden,
                                        int64_t n_hidden_rows);

/* ------------------------------------------------------------------------------------------ */
/* Outputs of the last step (or step_mtp), by output row (see gdn_batch_add). A row has a hidden
 * state always and logits when its token asked for them (otherwise gdn_context_get_logits refuses
 * it with INVALID_ARGUMENT). */

/* Number of output rows the last step produced. */
GDN_API gdn_status gdn_context_n_outputs(const gdn_context *ctx, int64_t *out_rows);

/* A pointer to row `row`'s vocab_size logits. Rows are contiguous: row r + 1 follows row r. Valid
 * until the next step, step_mtp or gdn_context_free on this context. */
GDN_API gdn_status gdn_context_get_logits(const gdn_context *ctx, int64_t row, const float **out_logits);

/* Copies rows [first_row, first_row + n_rows) into dst, which holds dst_capacity floats (at least
 * n_rows * vocab_size). */
GDN_API gdn_status gdn_context_copy_logits(const gdn_context *ctx, int64_t first_row, int64_t n_rows, float *dst,
                                           int64_t dst_capacity);

/* The same for the final hidden state after the last norm (hidden_size floats per row). */
GDN_API gdn_status gdn_context_get_hidden(const gdn_context *ctx, int64_t row, const float **out_hidden);
GDN_API gdn_status gdn_context_copy_hidden(const gdn_context *ctx, int64_t first_row, int64_t n_rows, float *dst,
                                           int64_t dst_capacity);

/* ------------------------------------------------------------------------------------------ */
/* Self-check (gdn doctor): the checks of `gdn doctor MODEL_DIR` (README.md, "gdn doctor") on a
 * checkpoint directory: config and tensors agree, convention fingerprints of the weights, internal
 * identities on the real weights (chunked == recurrent GDN, one step == several == decode, batch
 * == alone), value-head pairing, CPU vs CUDA, a degeneration probe. The report is JSON:
 *   {"model_dir", "ok", "seconds", "counts": {"PASS", "WARN", "FAIL", "SKIP"},
 *    "checks": [{"name", "verdict", "metric", "measured", "threshold", "message", "details", "seconds"}]}
 * A checkpoint that does not load is a report with FAILs naming why, not an error. */

/* Engine faults to inject, to see the checks that catch them fail (never for real use). */
enum {
    GDN_DOCTOR_FAULT_DROP_CONV_STATE = 1u << 0,  /* zero every GDN conv state at each step */
    GDN_DOCTOR_FAULT_TILED_VALUE_HEADS = 1u << 1 /* pair value head h with key head h % Hk (GGUF order) */
};

typedef struct gdn_doctor_params {
    uint32_t size;                 /* sizeof(gdn_doctor_params) */
    bool quick;                    /* shorter probes: seconds even on a large model (default false) */
    int32_t threads;               /* 0: one per hardware thread */
    gdn_state_dtype state_dtype;   /* the recurrent state the checks run with (default: the checkpoint's) */
    uint32_t faults;               /* GDN_DOCTOR_FAULT_* bits (0); an unknown bit is refused */
} gdn_doctor_params;

/* Fills *params with defaults; params->size must be set. INVALID_ARGUMENT: NULL or wrong size. */
GDN_API gdn_status gdn_doctor_params_init(gdn_doctor_params *params);

static inline gdn_doctor_params gdn_doctor_default_params(void) {
    gdn_doctor_params p;
    p.size = (uint32_t)sizeof p;
    (void)gdn_doctor_params_init(&p);
    return p;
}

/* Runs the doctor on `model_dir` (params may be NULL: defaults). *out_n_fail (may be NULL) receives
 * the number of checks that FAILed: 0 means the checkpoint passed. *out_json (may be NULL) receives
 * the report as NUL-terminated JSON, held per thread like gdn_last_error(): valid until the next
 * gdn_doctor_run on this thread (copy it to keep it).
 * Returns OK (whatever the verdicts) or INVALID_ARGUMENT (NULL model_dir, wrong-size params, an
 * unknown fault bit or state_dtype). */
GDN_API gdn_status gdn_doctor_run(const char *model_dir, const gdn_doctor_params *params, const char **out_json,
                                  int32_t *out_n_fail);

#ifdef __cplusplus
}  /* extern "C" */
#endif

#endif /* GDN_H */
