/* libgdn from C, through the stable C ABI of gdn.h and the shared library libgdn.so.
 *
 *   c_example MODEL_DIR
 *
 * Loads a checkpoint, runs three prompts of different lengths in one step, then decodes the three
 * sequences together, greedily, one token each per step. The C++, Python and ctypes examples do
 * the same and print the same lines. */
#include <stdio.h>
#include <stdlib.h>

#include <gdn.h>

#define N_SEQ 3
#define N_DECODE 8

/* Every fallible call returns a status; the message says what went wrong. */
#define CHECK(call)                                                                     \
    do {                                                                                \
        gdn_status status_ = (call);                                                    \
        if (status_ != GDN_STATUS_OK) {                                                 \
            fprintf(stderr, "error (%s): %s\n", gdn_status_string(status_), gdn_last_error()); \
            exit(1);                                                                    \
        }                                                                               \
    } while (0)

static gdn_token argmax(const float *v, int32_t n) {
    int32_t best = 0;
    for (int32_t i = 1; i < n; ++i)
        if (v[i] > v[best]) best = i;
    return best;
}

int main(int argc, char **argv) {
    static const gdn_token prompt0[] = {1, 2, 3, 4, 5};
    static const gdn_token prompt1[] = {42};
    static const gdn_token prompt2[] = {7, 99, 13, 200, 31, 64, 5, 150, 18, 77, 3};
    const gdn_token *prompts[N_SEQ] = {prompt0, prompt1, prompt2};
    const int64_t lengths[N_SEQ] = {5, 1, 11};
    gdn_token out[N_SEQ][N_DECODE];
    gdn_model *model = NULL;
    gdn_context *ctx = NULL;
    gdn_batch *batch = NULL;
    gdn_seq_id seq[N_SEQ];
    int64_t row[N_SEQ];
    const float *logits = NULL;
    int i, t;

    if (argc != 2) {
        fprintf(stderr, "usage: %s MODEL_DIR\n", argv[0]);
        return 2;
    }
    CHECK(gdn_model_load(argv[1], NULL, &model));
    gdn_model_config cfg;
    cfg.size = sizeof cfg; /* output structs, too, say which version the caller knows */
    CHECK(gdn_model_get_config(model, &cfg));
    printf("model: %s, %d layers (%d gated deltanet, %d attention), vocab %d\n", cfg.architecture, cfg.num_layers,
           cfg.num_linear_attention_layers, cfg.num_full_attention_layers, cfg.vocab_size);

    gdn_context_params cp = gdn_context_default_params();
    cp.max_sequences = N_SEQ;
    cp.max_context = 256;
    cp.threads = 2;
    CHECK(gdn_context_create(model, &cp, &ctx));
    CHECK(gdn_batch_init(N_SEQ, 64, &batch));

    /* One step: every prompt at once, logits of each prompt's last token. */
    for (i = 0; i < N_SEQ; ++i) {
        CHECK(gdn_seq_create(ctx, &seq[i]));
        CHECK(gdn_batch_add(batch, seq[i], prompts[i], lengths[i], GDN_LOGITS_LAST, 0, &row[i]));
    }
    CHECK(gdn_context_step(ctx, batch));
    for (i = 0; i < N_SEQ; ++i) {
        CHECK(gdn_context_get_logits(ctx, row[i], &logits));
        out[i][0] = argmax(logits, cfg.vocab_size);
    }

    /* Then all sequences decode together, one token each per step. */
    for (t = 1; t < N_DECODE; ++t) {
        CHECK(gdn_batch_clear(batch));
        for (i = 0; i < N_SEQ; ++i) CHECK(gdn_batch_add(batch, seq[i], &out[i][t - 1], 1, GDN_LOGITS_LAST, 0, &row[i]));
        CHECK(gdn_context_step(ctx, batch));
        for (i = 0; i < N_SEQ; ++i) {
            CHECK(gdn_context_get_logits(ctx, row[i], &logits));
            out[i][t] = argmax(logits, cfg.vocab_size);
        }
    }

    for (i = 0; i < N_SEQ; ++i) {
        int64_t length = 0;
        CHECK(gdn_seq_length(ctx, seq[i], &length));
        printf("seq %d (%lld positions):", i, (long long)length);
        for (t = 0; t < N_DECODE; ++t) printf(" %d", out[i][t]);
        printf("\n");
    }

    gdn_batch_free(batch);
    gdn_context_free(ctx);
    gdn_model_free(model);
    return 0;
}
