/* The shared library libgdn.so from plain C99 (compiled with -std=c99 -pedantic -Werror): the
 * header is C-clean, and the calls behave from C as tests/test_capi.cpp checks them from C++.
 * Prints "N passed, N failed" and exits non-zero on any failure. */
#include <stdio.h>
#include <string.h>

#include <gdn.h>

static int passed, failed;

#define EXPECT(cond)                                                                 \
    do {                                                                             \
        if (cond) {                                                                  \
            ++passed;                                                                \
        } else {                                                                     \
            ++failed;                                                                \
            fprintf(stderr, "%s:%d: failed: %s (last error: %s)\n", __FILE__, __LINE__, #cond, gdn_last_error()); \
        }                                                                            \
    } while (0)

int main(int argc, char **argv) {
    gdn_model *model = NULL;
    gdn_context *ctx = NULL;
    gdn_batch *batch = NULL;
    gdn_seq_id a = 0, b = 0;
    int64_t row = -2, rows = 0, len = 0;
    const float *logits = NULL, *logits_b = NULL;
    const gdn_token prompt[] = {1, 2, 3, 4};
    float copy[2 * 256];
    gdn_model_config cfg;
    gdn_context_params cp;
    gdn_context_memory mem;

    if (argc != 2) {
        fprintf(stderr, "usage: %s MODEL_DIR\n", argv[0]);
        return 2;
    }
    EXPECT(gdn_abi_version() == GDN_ABI_VERSION);
    EXPECT(strcmp(gdn_status_string(GDN_STATUS_INVALID_SEQUENCE), "invalid_sequence") == 0);

    /* NULLs and wrong sizes, before anything exists. */
    EXPECT(gdn_model_load(NULL, NULL, &model) == GDN_STATUS_INVALID_ARGUMENT);
    EXPECT(strstr(gdn_last_error(), "gdn_model_load") != NULL);
    EXPECT(model == NULL);
    EXPECT(gdn_context_step(NULL, NULL) == GDN_STATUS_INVALID_ARGUMENT);
    EXPECT(gdn_model_load("/nonexistent", NULL, &model) == GDN_STATUS_IO_ERROR);
    gdn_model_free(NULL);
    gdn_context_free(NULL);
    gdn_batch_free(NULL);

    EXPECT(gdn_model_load(argv[1], NULL, &model) == GDN_STATUS_OK);
    EXPECT(gdn_last_error()[0] == '\0');
    if (model == NULL) return 1;
    cfg.size = 3;
    EXPECT(gdn_model_get_config(model, &cfg) == GDN_STATUS_INVALID_ARGUMENT);
    EXPECT(strstr(gdn_last_error(), "wrong-size parameter struct") != NULL);
    cfg.size = sizeof cfg;
    EXPECT(gdn_model_get_config(model, &cfg) == GDN_STATUS_OK);
    EXPECT(cfg.vocab_size == 256);
    EXPECT(cfg.num_layers == cfg.num_linear_attention_layers + cfg.num_full_attention_layers);

    cp = gdn_context_default_params();
    EXPECT(cp.size == sizeof cp);
    EXPECT(cp.max_sequences > 0);
    cp.max_sequences = 2;
    cp.max_context = 64;
    cp.threads = 2;
    cp.size = 0;
    EXPECT(gdn_context_create(model, &cp, &ctx) == GDN_STATUS_INVALID_ARGUMENT);
    EXPECT(ctx == NULL);
    cp.size = sizeof cp;
    EXPECT(gdn_context_create(model, &cp, &ctx) == GDN_STATUS_OK);
    if (ctx == NULL) return 1;
    gdn_model_free(model); /* the context keeps it alive */

    EXPECT(gdn_seq_create(ctx, &a) == GDN_STATUS_OK);
    EXPECT(gdn_seq_create(ctx, &b) == GDN_STATUS_OK);
    EXPECT(gdn_seq_create(ctx, &b) == GDN_STATUS_OUT_OF_CAPACITY);
    EXPECT(gdn_batch_init(2, 8, &batch) == GDN_STATUS_OK);
    if (batch == NULL) return 1;

    /* The same prompt for both sequences in one step: identical logits rows. */
    EXPECT(gdn_batch_add(batch, a, prompt, 4, GDN_LOGITS_LAST, 0, &row) == GDN_STATUS_OK);
    EXPECT(row == 0);
    EXPECT(gdn_batch_add(batch, b, prompt, 4, GDN_LOGITS_LAST, 0, &row) == GDN_STATUS_OK);
    EXPECT(row == 1);
    EXPECT(gdn_context_step(ctx, batch) == GDN_STATUS_OK);
    EXPECT(gdn_context_n_outputs(ctx, &rows) == GDN_STATUS_OK);
    EXPECT(rows == 2);
    EXPECT(gdn_context_get_logits(ctx, 0, &logits) == GDN_STATUS_OK);
    EXPECT(gdn_context_get_logits(ctx, 1, &logits_b) == GDN_STATUS_OK);
    EXPECT(logits != NULL && logits_b == logits + 256);
    EXPECT(logits != NULL && logits_b != NULL && memcmp(logits, logits_b, 256 * sizeof(float)) == 0);
    EXPECT(gdn_context_copy_logits(ctx, 0, 2, copy, 2 * 256) == GDN_STATUS_OK);
    EXPECT(logits != NULL && memcmp(copy, logits, sizeof copy) == 0);
    EXPECT(gdn_context_copy_logits(ctx, 0, 2, copy, 256) == GDN_STATUS_INVALID_ARGUMENT);

    /* Reset makes a sequence fresh; free makes its handle stale. */
    EXPECT(gdn_seq_length(ctx, a, &len) == GDN_STATUS_OK && len == 4);
    EXPECT(gdn_seq_reset(ctx, a) == GDN_STATUS_OK);
    EXPECT(gdn_seq_length(ctx, a, &len) == GDN_STATUS_OK && len == 0);
    EXPECT(gdn_seq_free(ctx, b) == GDN_STATUS_OK);
    EXPECT(!gdn_seq_is_valid(ctx, b));
    EXPECT(gdn_seq_length(ctx, b, &len) == GDN_STATUS_INVALID_SEQUENCE);
    EXPECT(gdn_context_step(ctx, batch) == GDN_STATUS_INVALID_SEQUENCE);

    EXPECT(gdn_batch_clear(batch) == GDN_STATUS_OK);
    EXPECT(gdn_batch_add(batch, a, prompt, 4, GDN_LOGITS_LAST, 0, &row) == GDN_STATUS_OK);
    EXPECT(gdn_context_step(ctx, batch) == GDN_STATUS_OK);
    EXPECT(gdn_context_get_logits(ctx, 0, &logits) == GDN_STATUS_OK);
    EXPECT(logits != NULL && memcmp(copy, logits, 256 * sizeof(float)) == 0); /* reset == fresh */

    mem.size = sizeof mem;
    EXPECT(gdn_context_get_memory(ctx, &mem) == GDN_STATUS_OK);
    EXPECT(mem.live_sequences == 1);
    EXPECT(mem.gdn_state_bytes_per_sequence > 0);

    gdn_batch_free(batch);
    gdn_context_free(ctx);
    printf("%d passed, %d failed\n", passed, failed);
    return failed == 0 ? 0 : 1;
}
