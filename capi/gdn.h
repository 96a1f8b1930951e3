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
 *   - Handles (gdn_model, gdn_context, gdn_batch, gdn_tokenizer, gdn_stream_decoder, gdn_sampler,
 *     gdn_generation_result, gdn_speculative) are opaque. A NULL or foreign handle is refused
 *     with GDN_STATUS_INVALID_ARGUMENT; the *_free functions accept NULL and do nothing.
 *   - Every call that can fail returns a gdn_status. On failure, gdn_last_error() gives a
 *     human-readable message naming the function and the offending value; it is per thread and
 *     stays valid until the next status-returning call on that thread, which clears it on success.
 *     Output parameters are written only on success (one exception: a caller buffer that is too
 *     small gets told the size it needs; see "Caller buffers"). No C++ exception ever crosses this
 *     boundary.
 *   - A gdn_model is immutable and may be shared by any number of threads and contexts. A
 *     gdn_context (and a gdn_batch) is used by one thread at a time; the library enforces it (see
 *     "Threads").
 *   - A context keeps its model alive: gdn_model_free may come before gdn_context_free. Likewise a
 *     speculative decoder keeps its context alive, a stream decoder its tokenizer's tables, and a
 *     speculative decoder the samplers of the sequences it runs.
 *
 * Threads
 *   gdn_model, gdn_tokenizer and gdn_generation_result are immutable: any number of threads may use
 *   one at once. Every other handle is used by one thread at a time, and a call that breaks the rule
 *   is refused rather than allowed to corrupt the handle: each call marks the handles it uses as in
 *   use for its duration (an atomic flag; no lock, nothing allocated), and a call that finds a
 *   handle already in use returns GDN_STATUS_BUSY at once, having changed nothing, with a message
 *   naming the handle and the rule ("gdn_context_step: the context is in use by another thread; a
 *   gdn_context is used by one thread at a time ..."). A host that shares a handle between threads
 *   serialises its calls itself (a mutex per context); BUSY means it did not. In detail:
 *     - gdn_context: every call on it, the read-only ones (lengths, outputs, memory) included. A
 *       gdn_generate / gdn_generate_batch on it holds it for the whole generation, and a gdn_speculative
 *       call holds the context it drives: so a text callback that calls back into the context gets
 *       BUSY, as does gdn_seq_is_valid, which has no status to return: it reads false then, with the
 *       reason in gdn_last_error().
 *     - gdn_batch: gdn_batch_add / _clear change it; gdn_context_step / _step_mtp and gdn_batch_size
 *       only read it, so steps on several contexts may read one batch at once, but not while it changes.
 *     - gdn_sampler, gdn_stream_decoder, gdn_speculative: every call. A speculative decoder's start and
 *       advance also hold the samplers of the sequences they draw for.
 *     - Pointers the library hands out (logits, hidden states, a stream decoder's text) are read
 *       without any flag: they stay valid as documented at each call (until the next step, ...). A
 *       logits pointer read after another step of its context reads that step's numbers, or the
 *       outgrown buffer's stale ones, never freed memory (gdn_context_params.max_logits_rows).
 *     - gdn_*_free ends a handle's life: it must not race with other calls on that handle.
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
    GDN_STATUS_INTERNAL = 12,           /* a bug in libgdn; please report it */
    GDN_STATUS_BUSY = 13                /* the handle (or the context it drives) is in use by another thread, or by the
                                           call whose callback is running: see "Threads" below */
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

/* KV cache element type of the attention layers. DEFAULT: the backend's (CPU float32, CUDA bf16). BF16 halves
   the cache and the bytes a long-context decode step reads; keys and values are rounded to nearest even
   after the norm and RoPE, and attention still sums in float32 (docs/performance.md "Long context"). */
typedef enum gdn_kv_dtype {
    GDN_KV_DTYPE_DEFAULT = 0,
    GDN_KV_DTYPE_F32 = 1,
    GDN_KV_DTYPE_BF16 = 2
} gdn_kv_dtype;

/* The precision activations enter the projections at (values equal gdn::MatmulInput). FLOAT32 (default):
   exact float32 dot products. BF16: each activation rounded to bf16 first, as transformers runs a bf16
   checkpoint in bfloat16; on AVX-512-BF16 CPUs without AMX prefill and batched decode then run on vdpbf16ps
   at twice the multiply-adds per cycle. Everything else stays float32. */
typedef enum gdn_matmul_input {
    GDN_MATMUL_INPUT_FLOAT32 = 0,
    GDN_MATMUL_INPUT_BF16 = 1
} gdn_matmul_input;

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

/* Where the CPU backend reads the bf16 projections from (values equal gdn::WeightPlacement; see
 * gdn/model/model.hpp). AUTOMATIC (default): a valid packed image file (gdn_packed_image_write, `gdn pack`)
 * when there is one, else packed into anonymous memory at load when that fits the memory this process can
 * get, else read in place from the mapped checkpoint; a slower choice, or a refused image, is explained in
 * one line on stderr. PACKED: packed at load (no image looked for); OUT_OF_CAPACITY when the copy does not fit.
 * IN_PLACE: never packed nor mapped from an image. IMAGE: the image is required (IO_ERROR / INVALID_FILE). */
typedef enum gdn_weight_placement {
    GDN_WEIGHTS_AUTOMATIC = 0,
    GDN_WEIGHTS_PACKED = 1,
    GDN_WEIGHTS_IN_PLACE = 2,
    GDN_WEIGHTS_IMAGE = 3
} gdn_weight_placement;

/* Block-quantised projections for the CPU backend (values equal gdn::WeightQuant; docs/quantization.md):
 * every bf16 projection in blocks of 32 with a half-precision scale (Q4_K: a fitted scale and offset per
 * block, K-quant-like). NONE: the checkpoint's bf16 values. Q8_0 (8.5 bits per weight), Q4_0 (4.5), Q4_K
 * (4.625) and Q4_K_M (Q4_K with the projections llama.cpp's Q4_K_M gives more bits at Q8_0, and Q5_0,
 * 5.5 bits, where a row is not whole 256-column super-blocks, as llama.cpp's; both added after 0.1.0)
 * are read from MODEL_DIR/gdn-packed.<q8_0|q4_0|q4_k|q4_k_m>.gdnimg
 * (gdn_packed_image_write_quant, `gdn pack --quant`) when it exists, else quantised at load; never in
 * place (IN_PLACE with a quant is INVALID_ARGUMENT). */
typedef enum gdn_weight_quant {
    GDN_QUANT_NONE = 0,
    GDN_QUANT_Q8_0 = 1,
    GDN_QUANT_Q4_0 = 2,
    GDN_QUANT_Q4_K = 3,
    GDN_QUANT_Q4_K_M = 4
} gdn_weight_quant;

/* The lm_head's format under a quant (values equal gdn::LmHeadQuant): the output projection, or for tied
 * embeddings the quantised copy the logits (and the MTP head's) are computed with. AUTO (default): Q8_0
 * under Q4_0, Q4_K and Q4_K_M (as llama.cpp keeps its output tensor at 6 bits or more; it halves Q4_0's logit
 * error on gdn-tiny), else the quant's format. Q8_0 / Q4_0 / Q4_K: that format (a 4-bit one under a 4-bit
 * quant: every projection at 4 bits). Another format than AUTO's is read from
 * MODEL_DIR/gdn-packed.<quant>.lm_head-<format>.gdnimg; an image whose lm_head is in another format is
 * refused, never read as this one. A format without a quant is INVALID_ARGUMENT. */
typedef enum gdn_lm_head_quant {
    GDN_LM_HEAD_QUANT_AUTO = 0,
    GDN_LM_HEAD_QUANT_Q8_0 = 1,
    GDN_LM_HEAD_QUANT_Q4_0 = 2,
    GDN_LM_HEAD_QUANT_Q4_K = 3
} gdn_lm_head_quant;

typedef struct gdn_model_params {
    uint32_t size;     /* sizeof(gdn_model_params) */
    bool load_mtp;     /* bind the checkpoint's multi-token-prediction head when it has one (default true) */
    /* Added after 0.1.0 (a caller compiled before it gets the default). Nonzero: the same as
       weights = GDN_WEIGHTS_IN_PLACE. */
    uint32_t weights_in_place;
    /* Added after 0.1.0. The backend whose form of the weights the load makes (GDN_BACKEND_CPU: the packed
       images above; GDN_BACKEND_CUDA: a copy on `device`, BACKEND_UNAVAILABLE without one); contexts of the
       other backend make theirs when they are created. */
    gdn_backend backend;
    int32_t device;                /* CUDA device ordinal (0) */
    /* Added after 0.1.0. */
    gdn_weight_placement weights;  /* GDN_WEIGHTS_AUTOMATIC (default) */
    const char *packed_image;      /* the image AUTOMATIC / IMAGE look for; NULL: MODEL_DIR/gdn-packed.<layout>.gdnimg */
    /* Added after 0.1.0. */
    gdn_weight_quant quant;        /* GDN_QUANT_NONE (default) */
    gdn_lm_head_quant lm_head_quant;  /* GDN_LM_HEAD_QUANT_AUTO (default) */
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

/* What loading chose for the CPU backend: PACKED, IMAGE or IN_PLACE. */
GDN_API gdn_status gdn_model_get_weight_placement(const gdn_model *model, gdn_weight_placement *out_placement);

/* Writes the packed weight image of the checkpoint in model_path to out_path (NULL: where loading looks
 * for it, MODEL_DIR/gdn-packed.<layout>.gdnimg); later loads map it instead of packing (`gdn pack`).
 * UNSUPPORTED_MODEL when this CPU's kernel reads weights in place (AVX2, scalar), IO_ERROR, and the
 * errors of gdn_model_load. */
GDN_API gdn_status gdn_packed_image_write(const char *model_path, const char *out_path);

/* The same for a quantised image (Q8_0, Q4_0, Q4_K, Q4_K_M; NONE is gdn_packed_image_write): out_path NULL
 * writes MODEL_DIR/gdn-packed.<quant>.gdnimg, where loading with that quant looks. Deterministic: the same
 * checkpoint gives a byte-identical file. */
GDN_API gdn_status gdn_packed_image_write_quant(const char *model_path, const char *out_path, gdn_weight_quant quant);

/* Added after 0.1.0. The image a load with `params` (NULL: defaults) looks for: params->quant and
 * params->lm_head_quant choose the encoding (NONE: the bf16 image of gdn_packed_image_write); out_path NULL
 * writes it where that load looks (see gdn_lm_head_quant). The other fields are ignored. Deterministic. */
GDN_API gdn_status gdn_packed_image_write_params(const char *model_path, const char *out_path, const gdn_model_params *params);

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
    int32_t kv_page_size;          /* positions per KV page (default 64) */
    int64_t kv_pages;              /* 0: enough for every slot to reach max_context */
    int32_t max_batch_tokens;      /* rows per pass through the layers; larger steps are split (256) */
    int32_t max_logits_rows;       /* 0: max(max_sequences, 64); a larger step grows the buffer (the old one is kept:
                                      a pointer used too late reads stale values, never freed memory) */
    gdn_state_dtype state_dtype;   /* recurrent state dtype (default: the checkpoint's, float32) */
    int32_t threads;               /* 0: one per hardware thread */
    int32_t gdn_chunk_min_tokens;  /* a sequence advancing by at least this many tokens takes chunked GDN (16) */
    int32_t max_rollback_tokens;   /* > 0: a step of up to this many tokens per sequence can be partly undone (0) */
    gdn_backend backend;           /* GDN_BACKEND_CPU, or _CUDA: an NVIDIA GPU (bf16 activations, docs/cuda.md) */
    /* Added after 0.1.0 (a caller compiled before it gets the default). */
    gdn_matmul_input matmul_input; /* GDN_MATMUL_INPUT_FLOAT32 (default) or _BF16: see gdn_matmul_input */
    /* Added after 0.1.0. */
    int32_t device;                /* CUDA device ordinal (0) */
    bool cuda_graphs;              /* CUDA: replay repeated decode shapes from captured graphs (default true) */
    /* Added after 0.1.0. */
    gdn_kv_dtype kv_dtype;         /* KV cache element type (default: the backend's); CUDA takes BF16 only */
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

/* The memory plan of contexts made with context_params from the checkpoint in `path` loaded with
 * model_params (either may be NULL: defaults), from config.json and the safetensors headers only: no
 * weight is mapped or read (gdn/model/memory_plan.hpp; `gdn info`). Bytes throughout. CPU figures are
 * what a context allocates; CUDA ones are computed from sizes (bf16 weights and KV, float32 GDN state,
 * bf16 conv history, max_rollback_tokens + 1 state snapshots per slot). */
typedef struct gdn_memory_plan {
    uint32_t size;                            /* set by the caller: sizeof(gdn_memory_plan) */
    gdn_weight_placement weights;             /* what loading would choose now */
    int64_t weight_bytes;                     /* the checkpoint tensors the model reads */
    int64_t packed_bytes;                     /* their projections in the CPU kernel's order (0: none) */
    int64_t weights_anonymous_bytes;          /* anonymous memory for weights (a packed copy, float vectors) */
    int64_t weights_mapped_bytes;             /* file pages decode reads through mappings (page cache) */
    int64_t device_weight_bytes;              /* CUDA */
    int64_t gdn_recurrent_bytes_per_sequence;
    int64_t gdn_conv_bytes_per_sequence;
    int64_t kv_bytes_per_token;
    int64_t kv_pages;
    int64_t kv_bytes;
    int64_t rollback_bytes_per_sequence;
    int64_t scratch_bytes;                    /* work buffers and per-thread scratch */
    int64_t output_bytes;                     /* logits and hidden rows */
    int64_t context_bytes;                    /* everything a context allocates */
    int64_t host_bytes;                       /* CPU: weights (anonymous + mapped) + context */
    int64_t device_bytes;                     /* CUDA: weights + context */
    int64_t available_bytes;                  /* memory this process can get now */
    bool fits;                                /* host_bytes <= available_bytes */
    bool context_fits;                        /* the anonymous part fits: creating the context succeeds */
} gdn_memory_plan;

GDN_API gdn_status gdn_memory_plan_compute(const char *path, const gdn_model_params *model_params,
                                           const gdn_context_params *context_params, gdn_memory_plan *out_plan);

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
    GDN_BATCH_HIDDEN_ALL = 1u << 0,
    /* This step of the sequence will not be rolled back: a context with max_rollback_tokens > 0 skips
     * logging it (the log copies the sequence's GDN state; gdn_context_rollback then refuses it). */
    GDN_BATCH_NO_ROLLBACK = 1u << 1
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
 * CONTEXT_OVERFLOW, OUT_OF_CAPACITY or BUSY (the context, or the batch, in use by another thread:
 * see "Threads"). */
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
    /* Added after 0.1.0. */
    gdn_backend backend;           /* where the checks run (GDN_BACKEND_CPU); CUDA also compares against the CPU */
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

/* ------------------------------------------------------------------------------------------ */
/* Caller buffers. Calls that return a variable amount of data into caller memory (token ids, text)
 * take the buffer, its capacity and a required *out_n that receives the amount the result needs:
 *   - buffer NULL and capacity 0: a size query; returns OK with *out_n set and nothing else written;
 *   - capacity too small: returns OUT_OF_CAPACITY with *out_n set to the amount needed (the one
 *     output written on failure, so the caller can grow the buffer and call again); the buffer
 *     itself is untouched;
 *   - otherwise OK: the buffer holds the result, *out_n its amount.
 * Text is UTF-8 and always NUL-terminated in the buffer, so it needs capacity *out_len + 1; *out_len
 * does not count the NUL (text may contain NUL bytes of its own: use the length). */

/* ------------------------------------------------------------------------------------------ */
/* Tokenizer: the byte-level BPE of a Hugging Face tokenizer.json (gdn/io/tokenizer.hpp), with ids
 * identical to Hugging Face tokenizers'. A gdn_tokenizer is immutable: any number of threads may
 * use one at once. */

typedef struct gdn_tokenizer gdn_tokenizer;

/* Reads a tokenizer.json file. Returns OK, INVALID_ARGUMENT, IO_ERROR, INVALID_FILE (malformed)
 * or UNSUPPORTED_MODEL (a tokenizer feature libgdn does not implement). */
GDN_API gdn_status gdn_tokenizer_load(const char *path, gdn_tokenizer **out_tokenizer);
/* Reads MODEL_DIR/tokenizer.json, as a Hugging Face checkpoint ships it; statuses as above. */
GDN_API gdn_status gdn_tokenizer_load_model_dir(const char *model_dir, gdn_tokenizer **out_tokenizer);
/* The same from the text of a tokenizer.json (json_len bytes; need not be NUL-terminated). */
GDN_API gdn_status gdn_tokenizer_load_json(const char *json, size_t json_len, gdn_tokenizer **out_tokenizer);
/* NULL: no-op. Stream decoders made from the tokenizer keep what they need alive. */
GDN_API void gdn_tokenizer_free(gdn_tokenizer *tokenizer);

/* Number of ids: one more than the largest id of the vocabulary or the added tokens. */
GDN_API gdn_status gdn_tokenizer_vocab_size(const gdn_tokenizer *tokenizer, int32_t *out_vocab_size);

/* Flags of gdn_tokenizer_encode / gdn_tokenizer_decode / gdn_stream_decoder_create (bits; a bit
 * this library does not know is refused). */
enum {
    /* encode: read special added tokens ("<|im_start|>", ...) in the text as plain text. Without it
     * they become their ids, as Hugging Face's encode() does by default. */
    GDN_TOKENIZE_SPECIAL_AS_TEXT = 1u << 0,
    /* decode: leave special tokens out of the text. */
    GDN_DECODE_SKIP_SPECIAL = 1u << 1
};

/* The ids of UTF-8 `text` (text_len bytes; need not be NUL-terminated); no BOS or EOS is added.
 * out_ids / capacity / *out_n_ids follow "Caller buffers" above. INVALID_ARGUMENT also for text
 * that is not valid UTF-8. */
GDN_API gdn_status gdn_tokenizer_encode(const gdn_tokenizer *tokenizer, const char *text, size_t text_len, uint32_t flags,
                                        gdn_token *out_ids, int64_t capacity, int64_t *out_n_ids);

/* The UTF-8 text of n_ids ids (ill-formed byte sequences become U+FFFD), into out_text per "Caller
 * buffers" above. INVALID_TOKEN for an id outside [0, vocab_size). */
GDN_API gdn_status gdn_tokenizer_decode(const gdn_tokenizer *tokenizer, const gdn_token *ids, int64_t n_ids, uint32_t flags,
                                        char *out_text, size_t capacity, size_t *out_len);

/* The id of a token spelled as tokenizer.json spells it (an added token's content, or a vocabulary
 * entry in byte-level form, e.g. "Ġthe"); *out_id = -1 when there is none. */
GDN_API gdn_status gdn_tokenizer_token_to_id(const gdn_tokenizer *tokenizer, const char *token, size_t token_len,
                                             gdn_token *out_id);
/* The spelling of `id` in tokenizer.json, NUL-terminated, pointing into the tokenizer (valid until
 * gdn_tokenizer_free). *out_is_special (may be NULL) tells whether it is a special added token.
 * INVALID_TOKEN for an id outside [0, vocab_size). */
GDN_API gdn_status gdn_tokenizer_id_to_token(const gdn_tokenizer *tokenizer, gdn_token id, const char **out_token,
                                             size_t *out_len, bool *out_is_special);

/* Incremental decoding for generation: one id in, only complete UTF-8 text out. The bytes of a
 * character split across tokens are held until it is complete. The concatenated pushes and the final
 * flush equal gdn_tokenizer_decode of the same ids. Keeps its tokenizer's tables alive (the
 * tokenizer may be freed first). One thread at a time (BUSY otherwise). */
typedef struct gdn_stream_decoder gdn_stream_decoder;

/* flags: 0 or GDN_DECODE_SKIP_SPECIAL. */
GDN_API gdn_status gdn_stream_decoder_create(const gdn_tokenizer *tokenizer, uint32_t flags,
                                             gdn_stream_decoder **out_decoder);
GDN_API void gdn_stream_decoder_free(gdn_stream_decoder *decoder);
/* The text `id` completes (often empty: *out_len 0). *out_text is NUL-terminated, points into the
 * decoder and stays valid until its next call. INVALID_TOKEN for a bad id (nothing changes). */
GDN_API gdn_status gdn_stream_decoder_push(gdn_stream_decoder *decoder, gdn_token id, const char **out_text,
                                           size_t *out_len);
/* Whatever is still held, an unfinished character as U+FFFD; the decoder then starts afresh. */
GDN_API gdn_status gdn_stream_decoder_flush(gdn_stream_decoder *decoder, const char **out_text, size_t *out_len);
/* Drops what is held, without returning it. */
GDN_API gdn_status gdn_stream_decoder_reset(gdn_stream_decoder *decoder);

/* ------------------------------------------------------------------------------------------ */
/* Chat template: the Qwen3.5 / Qwen3.6 template (ChatML with <think> blocks and XML tool calls;
 * gdn/text/chat_template.hpp), byte for byte what transformers' apply_chat_template(..., tokenize=False)
 * returns, for text conversations (gdn_chat_render: roles and contents; gdn_chat_render_json: tools and tool
 * calls too). */

typedef struct gdn_chat_params {
    uint32_t size;               /* sizeof(gdn_chat_params) */
    bool add_generation_prompt;  /* end with the assistant's turn opened (default false) */
    bool enable_thinking;        /* false pre-fills an empty <think></think> block (default true) */
    bool preserve_thinking;      /* Qwen3.6: keep the reasoning of every assistant turn (default false) */
} gdn_chat_params;

/* Fills *params with defaults; params->size must be set. INVALID_ARGUMENT: NULL or wrong size. */
GDN_API gdn_status gdn_chat_params_init(gdn_chat_params *params);

static inline gdn_chat_params gdn_chat_default_params(void) {
    gdn_chat_params p;
    p.size = (uint32_t)sizeof p;
    (void)gdn_chat_params_init(&p);
    return p;
}

/* Renders n_messages messages, given as parallel arrays of NUL-terminated strings: roles[i]
 * ("system", "user", "assistant" or "tool"), contents[i] (an element NULL renders as None: empty)
 * and reasoning_contents (the array may be NULL, and so may an element: then an assistant turn's
 * reasoning is what <think>...</think> in its content holds). params may be NULL (defaults). The
 * text goes into out_text per "Caller buffers" above. INVALID_ARGUMENT with the template's own
 * message for what it rejects ("No user query found in messages.", ...). */
GDN_API gdn_status gdn_chat_render(const char *const *roles, const char *const *contents,
                                   const char *const *reasoning_contents, size_t n_messages,
                                   const gdn_chat_params *params, char *out_text, size_t capacity, size_t *out_len);

/* The same for a conversation given as JSON, as OpenAI's API and transformers take it (tools and tool
 * calls included; gdn::render_chat_json): messages_json is an array of {"role", "content" (a string, null
 * or a list of text parts), "reasoning_content", "tool_calls": [{"type": "function", "function": {"name",
 * "arguments" (an object or a JSON string holding one)}}]} objects; tools_json an array of tools
 * ({"type": "function", "function": {...}}), or NULL / "null" for none. The tools are written as
 * transformers writes them (Python's json.dumps), the calls in the template's <tool_call> XML.
 * INVALID_ARGUMENT naming what is wrong: JSON that does not parse, malformed tool calls, image or video
 * parts (the model reads text only), and what the template itself rejects. */
GDN_API gdn_status gdn_chat_render_json(const char *messages_json, const char *tools_json, const gdn_chat_params *params,
                                        char *out_text, size_t capacity, size_t *out_len);

/* ------------------------------------------------------------------------------------------ */
/* Sampling (gdn/runtime/sampling.hpp): penalties on tokens already seen, then temperature, top-k,
 * top-p and min-p, in the order transformers' generate() applies them, and a draw from the
 * sampler's own seeded RNG: the same seed gives the same tokens on every machine. */

typedef struct gdn_sampling_params {
    uint32_t size;             /* sizeof(gdn_sampling_params) */
    float temperature;         /* 0: greedy (argmax after penalties); the default */
    int32_t top_k;             /* 0: off */
    float top_p;               /* 1: off; in (0, 1] */
    float min_p;               /* 0: off; keeps tokens with p >= min_p * p_max */
    float repetition_penalty;  /* 1: off; > 1 discourages seen tokens (logit > 0: / penalty, else * penalty) */
    float presence_penalty;    /* 0: off; subtracted once from the logit of every seen token */
    uint64_t seed;             /* the RNG's seed (default 0) */
    float frequency_penalty;   /* 0: off; subtracted from a seen token's logit once per occurrence (added in 0.1) */
} gdn_sampling_params;

/* Fills *params with defaults; params->size must be set. INVALID_ARGUMENT: NULL or wrong size. */
GDN_API gdn_status gdn_sampling_params_init(gdn_sampling_params *params);

static inline gdn_sampling_params gdn_sampling_default_params(void) {
    gdn_sampling_params p;
    p.size = (uint32_t)sizeof p;
    (void)gdn_sampling_params_init(&p);
    return p;
}

/* One sequence's sampler: its settings, the tokens its penalties have seen, its RNG. Keep one per
 * sequence; one thread at a time (BUSY otherwise, also while a gdn_speculative call samples with it). */
typedef struct gdn_sampler gdn_sampler;

/* params may be NULL (greedy). vocab_size: the model's (gdn_model_config.vocab_size).
 * INVALID_ARGUMENT for out-of-range settings (temperature < 0, top_p outside (0, 1], ...). */
GDN_API gdn_status gdn_sampler_create(const gdn_sampling_params *params, int32_t vocab_size, gdn_sampler **out_sampler);
/* NULL: no-op. A speculative decoder that samples with it keeps it alive until its sequence ends. */
GDN_API void gdn_sampler_free(gdn_sampler *sampler);
/* Records tokens for the penalties (the prompt, then each token the sequence takes); sampling does
 * not record the token it draws. */
GDN_API gdn_status gdn_sampler_observe(gdn_sampler *sampler, const gdn_token *tokens, int64_t n_tokens);
/* Draws a token from vocab_size logits (n_logits must equal the sampler's vocab_size). */
GDN_API gdn_status gdn_sampler_sample(gdn_sampler *sampler, const float *logits, int64_t n_logits, gdn_token *out_token);
/* The same from output row `row` of the context's last step. */
GDN_API gdn_status gdn_sampler_sample_row(gdn_sampler *sampler, const gdn_context *ctx, int64_t row, gdn_token *out_token);
/* The distribution a draw would come from (vocab_size floats summing to 1, zero outside the kept
 * set; one-hot for greedy) into probs, which holds capacity floats (at least vocab_size). */
GDN_API gdn_status gdn_sampler_distribution(const gdn_sampler *sampler, const float *logits, int64_t n_logits, float *probs,
                                            int64_t capacity);

/* ------------------------------------------------------------------------------------------ */
/* Text generation (gdn/runtime/generator.hpp): prompt ids in, streamed text out, per-sequence
 * sampling, stop tokens (the checkpoint's eos ids from config.json and generation_config.json, plus
 * any extra), stop strings that may span tokens (nothing after one is emitted), a token limit, and
 * optional MTP speculative decoding. Several prompts may be generated together: each step advances
 * every unfinished sequence at once. Each call creates its sequences in the context and frees them
 * before it returns, so the context needs max_sequences free slots (one per prompt) and
 * max_context >= prompt + max_tokens (+ mtp_draft + 1). */

/* Values equal gdn::FinishReason. */
typedef enum gdn_finish_reason {
    GDN_FINISH_NONE = 0,
    GDN_FINISH_STOP_TOKEN = 1,   /* an eos id or one of stop_tokens (the token is in the result) */
    GDN_FINISH_STOP_STRING = 2,  /* one of stop_strings (the text ends before it) */
    GDN_FINISH_LENGTH = 3,       /* max_tokens */
    GDN_FINISH_CANCELLED = 4     /* the text callback returned 0 */
} gdn_finish_reason;

typedef struct gdn_generation_params {
    uint32_t size;                      /* sizeof(gdn_generation_params) */
    int32_t max_tokens;                 /* >= 1 (default 256) */
    /* The sequence's sampling settings, read during the call (NULL: greedy). A pointer rather than
     * an embedded struct so that either struct can grow without moving the other's fields. */
    const gdn_sampling_params *sampling;
    bool stop_on_eos;                   /* stop at the checkpoint's eos ids (default true) */
    int32_t n_stop_tokens;              /* extra ids that end the sequence (default none) */
    const gdn_token *stop_tokens;
    int32_t n_stop_strings;             /* NUL-terminated UTF-8 strings matched in the text (default none) */
    const char *const *stop_strings;
    int32_t mtp_draft;                  /* > 0: MTP speculative decoding, up to this many drafts per step
                                           (the context needs max_rollback_tokens >= mtp_draft + 1); 0: off */
    bool mtp_adaptive;                  /* let the decoder lower the draft length (to 0) when drafting
                                           does not pay (default true) */
} gdn_generation_params;

/* Fills *params with defaults; params->size must be set. INVALID_ARGUMENT: NULL or wrong size. */
GDN_API gdn_status gdn_generation_params_init(gdn_generation_params *params);

static inline gdn_generation_params gdn_generation_default_params(void) {
    gdn_generation_params p;
    p.size = (uint32_t)sizeof p;
    (void)gdn_generation_params_init(&p);
    return p;
}

/* Receives each piece of text of sequence `sequence` (the prompt's index in the call) as soon as it
 * is final: never half a UTF-8 character, never the start of a stop string that may still complete.
 * text is NUL-terminated and valid only during the call. Return nonzero to go on, 0 to stop that
 * sequence (finish reason GDN_FINISH_CANCELLED). It runs on the calling thread and must not use the
 * context (a call on it returns GDN_STATUS_BUSY: the generation holds it). */
typedef int (*gdn_text_callback)(void *user_data, int32_t sequence, const char *text, size_t len);

/* The results of one gdn_generate / gdn_generate_batch call: one per prompt, read through the
 * accessors below; everything they point to stays valid until gdn_generation_result_free. */
typedef struct gdn_generation_result gdn_generation_result;

/* Generates from one prompt (n_prompt >= 1 ids) with `tokenizer` (the checkpoint's; it turns tokens
 * into text and is only read). params may be NULL (defaults); on_text may be NULL. On failure no
 * sequence is left in the context and *out_result is not written.
 * Returns OK, INVALID_ARGUMENT (max_tokens < 1, an empty prompt, mtp_draft and a context without
 * enough max_rollback_tokens), UNSUPPORTED_MODEL (mtp_draft > 0 without an MTP head),
 * OUT_OF_CAPACITY (no free slot), CONTEXT_OVERFLOW, INVALID_TOKEN, BUSY (the context is in use). */
GDN_API gdn_status gdn_generate(gdn_context *ctx, const gdn_tokenizer *tokenizer, const gdn_token *prompt, int64_t n_prompt,
                                const gdn_generation_params *params, gdn_text_callback on_text, void *user_data,
                                gdn_generation_result **out_result);

/* Several prompts together: prompts[i] holds n_prompt_tokens[i] ids and is generated with
 * params[i] (params may be NULL, and so may an element: defaults). All params must share mtp_draft.
 * The callback's `sequence` is i. Statuses as gdn_generate. */
GDN_API gdn_status gdn_generate_batch(gdn_context *ctx, const gdn_tokenizer *tokenizer, int32_t n_prompts,
                                      const gdn_token *const *prompts, const int64_t *n_prompt_tokens,
                                      const gdn_generation_params *const *params, gdn_text_callback on_text,
                                      void *user_data, gdn_generation_result **out_result);

GDN_API void gdn_generation_result_free(gdn_generation_result *result);
/* Number of sequences (prompts) the result holds. */
GDN_API gdn_status gdn_generation_result_count(const gdn_generation_result *result, int32_t *out_count);
/* Sequence i's generated ids (a stop token included); *out_tokens may be NULL when there are none. */
GDN_API gdn_status gdn_generation_result_tokens(const gdn_generation_result *result, int32_t i, const gdn_token **out_tokens,
                                                int64_t *out_n_tokens);
/* Sequence i's text, exactly the concatenation of the pieces the callback received: special tokens
 * left out, cut before a stop string. NUL-terminated. */
GDN_API gdn_status gdn_generation_result_text(const gdn_generation_result *result, int32_t i, const char **out_text,
                                              size_t *out_len);

typedef struct gdn_generation_info {
    uint32_t size;                /* set by the caller: sizeof(gdn_generation_info) */
    gdn_finish_reason finish;
    int64_t prompt_tokens;
    int64_t generated_tokens;
    double prefill_seconds;       /* prompt processing (shared by all sequences of a batch) */
    double decode_seconds;        /* everything after the first token */
} gdn_generation_info;

/* Fills *out_info for sequence i (out_info->size must be set). */
GDN_API gdn_status gdn_generation_result_get_info(const gdn_generation_result *result, int32_t i,
                                                  gdn_generation_info *out_info);

/* ------------------------------------------------------------------------------------------ */
/* MTP speculative decoding (gdn/runtime/speculative.hpp): the checkpoint's multi-token-prediction
 * head drafts up to max_draft tokens, one main-model step verifies them, the longest agreeing
 * prefix is kept (greedy: tokens identical to plain greedy decoding) or rejection sampling keeps
 * the output distribution (temperature > 0), and the rest is rolled back exactly. gdn_generate with
 * mtp_draft > 0 does all this; the handle below is for a host that runs its own loop. */

typedef struct gdn_speculative_params {
    uint32_t size;     /* sizeof(gdn_speculative_params) */
    int32_t max_draft; /* drafted tokens per round, at most, in [0, 16] (default 3) */
    bool adaptive;     /* choose the draft length in [0, max_draft] by measured speed (default true) */
} gdn_speculative_params;

/* Fills *params with defaults; params->size must be set. INVALID_ARGUMENT: NULL or wrong size. */
GDN_API gdn_status gdn_speculative_params_init(gdn_speculative_params *params);

static inline gdn_speculative_params gdn_speculative_default_params(void) {
    gdn_speculative_params p;
    p.size = (uint32_t)sizeof p;
    (void)gdn_speculative_params_init(&p);
    return p;
}

typedef struct gdn_speculative_stats {
    uint32_t size;           /* set by the caller: sizeof(gdn_speculative_stats) */
    int32_t k;               /* the current draft length */
    int64_t rounds;          /* verify steps (and plain steps when k is 0) */
    int64_t drafted;         /* draft tokens proposed */
    int64_t accepted;        /* draft tokens accepted */
    int64_t generated;       /* tokens produced */
    int64_t draft_rounds;    /* rounds that drafted */
} gdn_speculative_stats;

/* The speculative statistics of the call's decoder (shared by all its sequences; all zero when
 * mtp_draft was 0); i as for the other accessors. */
GDN_API gdn_status gdn_generation_result_get_speculative_stats(const gdn_generation_result *result, int32_t i,
                                                               gdn_speculative_stats *out_stats);

typedef struct gdn_speculative gdn_speculative;

/* A decoder on `ctx` (params may be NULL: defaults); it keeps the context alive. Its calls hold the
 * context too, so they and the context's own calls are one thread at a time (BUSY otherwise), even
 * after gdn_context_free. UNSUPPORTED_MODEL when the model has no MTP head (or was loaded without
 * it); INVALID_ARGUMENT when max_draft is outside [0, 16] or the context's max_rollback_tokens is
 * below max_draft + 1. */
GDN_API gdn_status gdn_speculative_create(gdn_context *ctx, const gdn_speculative_params *params,
                                          gdn_speculative **out_spec);
GDN_API void gdn_speculative_free(gdn_speculative *spec);

/* Prefills the prompt on `seq` (a fresh sequence of the context), catches the MTP layer up on it
 * and draws the first token with `sampler` (which records the prompt), into *out_token. That token
 * is pending: the next advance feeds it to the model. The decoder holds the sampler until
 * gdn_speculative_finish(seq) or its own free. */
GDN_API gdn_status gdn_speculative_start(gdn_speculative *spec, gdn_seq_id seq, const gdn_token *prompt, int64_t n_prompt,
                                         gdn_sampler *sampler, gdn_token *out_token);

/* One round for each of the n_seqs started sequences: sequence i gets 1 to k + 1 new tokens,
 * written to out_tokens[i][0 .. out_counts[i]); each buffer holds `capacity` tokens, which must be
 * at least max_draft + 1. The last token written is the new pending one. Tokens are written only
 * on success. INVALID_SEQUENCE for a sequence that was not started (or finished); CONTEXT_OVERFLOW,
 * before any work, when a sequence has fewer than max_draft + 1 positions left in the context. */
GDN_API gdn_status gdn_speculative_advance(gdn_speculative *spec, const gdn_seq_id *seqs, int32_t n_seqs,
                                           gdn_token *const *out_tokens, int64_t capacity, int64_t *out_counts);

/* Stops tracking `seq` (the sequence itself stays in the context) and lets go of its sampler. */
GDN_API gdn_status gdn_speculative_finish(gdn_speculative *spec, gdn_seq_id seq);

/* Statistics over every sequence the decoder ran (out_stats->size must be set). */
GDN_API gdn_status gdn_speculative_get_stats(const gdn_speculative *spec, gdn_speculative_stats *out_stats);

#ifdef __cplusplus
}  /* extern "C" */
#endif

#endif /* GDN_H */
