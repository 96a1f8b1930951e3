/* Text generation from C, through the stable C ABI of gdn.h and the shared library libgdn.so.
 *
 *   c_generate MODEL_DIR PROMPT [MTP_DRAFT]
 *
 * Loads a checkpoint and its tokenizer.json, encodes the prompt, and generates greedily, streaming
 * the text to stdout as it comes (with MTP speculative decoding when MTP_DRAFT > 0); then prints
 * the finish reason and the token counts. With models/gdn-tiny, "reverse 12478 =" prints 87421. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <gdn.h>

#define CHECK(call)                                                                     \
    do {                                                                                \
        gdn_status status_ = (call);                                                    \
        if (status_ != GDN_STATUS_OK) {                                                 \
            fprintf(stderr, "error (%s): %s\n", gdn_status_string(status_), gdn_last_error()); \
            exit(1);                                                                    \
        }                                                                               \
    } while (0)

/* Each piece of text, as soon as it is final. Returning 0 would stop the sequence. */
static int print_piece(void *user_data, int32_t sequence, const char *text, size_t len) {
    (void)user_data;
    (void)sequence;
    fwrite(text, 1, len, stdout);
    fflush(stdout);
    return 1;
}

int main(int argc, char **argv) {
    static const char *finish_names[] = {"none", "stop_token", "stop_string", "length", "cancelled"};
    gdn_model *model = NULL;
    gdn_tokenizer *tok = NULL;
    gdn_context *ctx = NULL;
    gdn_generation_result *result = NULL;
    gdn_token *prompt = NULL;
    int64_t n_prompt = 0;
    int mtp = argc > 3 ? atoi(argv[3]) : 0;

    if (argc < 3) {
        fprintf(stderr, "usage: %s MODEL_DIR PROMPT [MTP_DRAFT]\n", argv[0]);
        return 2;
    }
    CHECK(gdn_model_load(argv[1], NULL, &model));
    CHECK(gdn_tokenizer_load_model_dir(argv[1], &tok));

    /* Ids with the two-call protocol: ask for the count, then fill a buffer that size. */
    CHECK(gdn_tokenizer_encode(tok, argv[2], strlen(argv[2]), 0, NULL, 0, &n_prompt));
    prompt = malloc((size_t)(n_prompt > 0 ? n_prompt : 1) * sizeof *prompt);
    if (prompt == NULL) return 1;
    CHECK(gdn_tokenizer_encode(tok, argv[2], strlen(argv[2]), 0, prompt, n_prompt, &n_prompt));

    gdn_context_params cp = gdn_context_default_params();
    cp.max_sequences = 1;
    cp.max_context = (int32_t)n_prompt + 64;
    cp.max_rollback_tokens = mtp > 0 ? mtp + 1 : 0; /* speculative decoding rolls rejected drafts back */
    cp.threads = 2;
    CHECK(gdn_context_create(model, &cp, &ctx));

    gdn_generation_params gp = gdn_generation_default_params(); /* greedy; the model's eos ids stop it */
    gp.max_tokens = 32;
    gp.mtp_draft = mtp;
    CHECK(gdn_generate(ctx, tok, prompt, n_prompt, &gp, print_piece, NULL, &result));

    gdn_generation_info info;
    info.size = sizeof info;
    CHECK(gdn_generation_result_get_info(result, 0, &info));
    printf("\n[finish: %s, %lld prompt tokens, %lld generated]\n", finish_names[info.finish], (long long)info.prompt_tokens,
           (long long)info.generated_tokens);

    gdn_generation_result_free(result);
    gdn_context_free(ctx);
    gdn_tokenizer_free(tok);
    gdn_model_free(model);
    free(prompt);
    return 0;
}
