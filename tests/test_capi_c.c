/* The shared library libgdn.so from plain C99 (compiled with -std=c99 -pedantic -Werror): the
 * header is C-clean, and the calls behave from C as tests/test_capi.cpp checks them from C++.
 *   test_capi_c FIXTURE_MODEL_DIR [GDN_TINY_DIR QWEN_TOKENIZER_JSON_GZ]
 * With the last two, also the text API: the real Qwen tokenizer's ids, the caller-buffer protocol,
 * and generation on the trained models/gdn-tiny (plain, cancelled, MTP, the speculative handle).
 * Prints "N passed, N failed" and exits non-zero on any failure. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <zlib.h>

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

/* The whole of a gzip file, malloc'ed (NULL on failure). */
static char *read_gz(const char *path, size_t *out_len) {
    gzFile f = gzopen(path, "rb");
    size_t cap = 1 << 20, len = 0;
    char *buf = malloc(cap);
    int n;
    if (f == NULL || buf == NULL) {
        if (f != NULL) gzclose(f);
        free(buf);
        return NULL;
    }
    while ((n = gzread(f, buf + len, (unsigned)(cap - len))) > 0) {
        len += (size_t)n;
        if (len == cap) {
            char *bigger = realloc(buf, cap *= 2);
            if (bigger == NULL) break;
            buf = bigger;
        }
    }
    gzclose(f);
    *out_len = len;
    return buf;
}

static int same_ids(const gdn_token *a, int64_t na, const gdn_token *b, int64_t nb) {
    return na == nb && (na == 0 || memcmp(a, b, (size_t)na * sizeof *a) == 0);
}

/* The streamed text of one sequence, and when to stop it. */
typedef struct {
    char text[256];
    size_t len;
    int calls, cancel_at;
} collected;

static int collect(void *user, int32_t seq, const char *text, size_t len) {
    collected *c = (collected *)user;
    if (seq == 0 && c->len + len < sizeof c->text) {
        memcpy(c->text + c->len, text, len);
        c->len += len;
        c->text[c->len] = '\0';
    }
    return ++c->calls != c->cancel_at;
}

static void test_tokenizer(const char *qwen_gz) {
    /* Ids as gdn::Tokenizer gives them (tests/test_tokenizer.cpp checks it against Hugging Face). */
    static const gdn_token hello_ids[] = {9419, 11, 1814, 0};
    static const gdn_token cjk_ids[] = {99986, 95880, 96919, 99449, 3709, 247359, 15303, 210342};
    static const gdn_token emoji_ids[] = {36280, 10838, 99, 222, 9008, 248, 222, 2725};
    static const gdn_token chat_ids[] = {248045, 846, 198, 5834, 248046};
    const char *texts[4] = {"Hello, world!", "\xe4\xb8\xad\xe6\x96\x87\xe5\x88\x86\xe8\xaf\x8d\xe6\xb5\x8b\xe8\xaf\x95"
                            "\xef\xbc\x8c\xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e\xe3\x81\xae\xe3\x83\x86\xe3\x82\xad"
                            "\xe3\x82\xb9\xe3\x83\x88",
                            "emoji \xf0\x9f\xa6\x80\xf0\x9f\x9a\x80 done", "<|im_start|>user\nhi<|im_end|>"};
    const gdn_token *expect[4] = {hello_ids, cjk_ids, emoji_ids, chat_ids};
    const int64_t n_expect[4] = {4, 8, 8, 5};
    gdn_tokenizer *tok = NULL;
    gdn_stream_decoder *dec = NULL;
    gdn_token ids[64];
    char text[256], streamed[256];
    int64_t n = -1, told = -1;
    size_t len = 0, told_len = 0, json_len = 0, streamed_len = 0;
    const char *piece = NULL;
    int32_t vocab = 0;
    int i, empty = 0;
    char *json = read_gz(qwen_gz, &json_len);

    EXPECT(json != NULL);
    if (json == NULL) return;
    EXPECT(gdn_tokenizer_load_json(json, json_len, &tok) == GDN_STATUS_OK);
    free(json);
    if (tok == NULL) return;
    EXPECT(gdn_tokenizer_vocab_size(tok, &vocab) == GDN_STATUS_OK && vocab > 150000);
    for (i = 0; i < 4; ++i) {
        EXPECT(gdn_tokenizer_encode(tok, texts[i], strlen(texts[i]), 0, ids, 64, &n) == GDN_STATUS_OK);
        EXPECT(same_ids(ids, n, expect[i], n_expect[i]));
        EXPECT(gdn_tokenizer_decode(tok, ids, n, 0, text, sizeof text, &len) == GDN_STATUS_OK);
        EXPECT(len == strlen(texts[i]) && strcmp(text, texts[i]) == 0);
    }
    /* Special tokens as text; skipped when decoding. */
    EXPECT(gdn_tokenizer_encode(tok, texts[3], strlen(texts[3]), GDN_TOKENIZE_SPECIAL_AS_TEXT, ids, 64, &n) == GDN_STATUS_OK);
    EXPECT(n > 5);
    EXPECT(gdn_tokenizer_decode(tok, chat_ids, 5, GDN_DECODE_SKIP_SPECIAL, text, sizeof text, &len) == GDN_STATUS_OK);
    EXPECT(strcmp(text, "user\nhi") == 0);

    /* Caller buffers: a size query, too small (the size still told, the buffer untouched), exact. */
    EXPECT(gdn_tokenizer_encode(tok, texts[1], strlen(texts[1]), 0, NULL, 0, &n) == GDN_STATUS_OK && n == 8);
    ids[0] = -7;
    EXPECT(gdn_tokenizer_encode(tok, texts[1], strlen(texts[1]), 0, ids, 7, &told) == GDN_STATUS_OUT_OF_CAPACITY);
    EXPECT(told == 8 && ids[0] == -7);
    EXPECT(gdn_tokenizer_encode(tok, texts[1], strlen(texts[1]), 0, ids, 8, &told) == GDN_STATUS_OK);
    EXPECT(same_ids(ids, told, cjk_ids, 8));
    EXPECT(gdn_tokenizer_decode(tok, cjk_ids, 8, 0, NULL, 0, &len) == GDN_STATUS_OK && len == strlen(texts[1]));
    EXPECT(gdn_tokenizer_decode(tok, cjk_ids, 8, 0, text, len, &told_len) == GDN_STATUS_OUT_OF_CAPACITY);
    EXPECT(told_len == len);
    EXPECT(gdn_tokenizer_decode(tok, cjk_ids, 8, 0, NULL, 4, &told_len) == GDN_STATUS_INVALID_ARGUMENT);
    EXPECT(gdn_tokenizer_encode(NULL, "a", 1, 0, NULL, 0, &n) == GDN_STATUS_INVALID_ARGUMENT);
    EXPECT(gdn_tokenizer_encode(tok, "a", 1, 1u << 8, NULL, 0, &n) == GDN_STATUS_INVALID_ARGUMENT);

    /* The emoji's bytes are split across ids: the stream decoder holds them back. */
    EXPECT(gdn_stream_decoder_create(tok, 0, &dec) == GDN_STATUS_OK);
    gdn_tokenizer_free(tok); /* the decoder keeps the tables */
    if (dec == NULL) return;
    for (i = 0; i < 8; ++i) {
        EXPECT(gdn_stream_decoder_push(dec, emoji_ids[i], &piece, &len) == GDN_STATUS_OK);
        empty += len == 0;
        memcpy(streamed + streamed_len, piece, len);
        streamed_len += len;
    }
    EXPECT(gdn_stream_decoder_flush(dec, &piece, &len) == GDN_STATUS_OK && len == 0);
    streamed[streamed_len] = '\0';
    EXPECT(empty > 0);
    EXPECT(strcmp(streamed, texts[2]) == 0);
    gdn_stream_decoder_free(dec);
}

static void test_generation(const char *tiny_dir) {
    gdn_model *model = NULL;
    gdn_context *ctx = NULL;
    gdn_tokenizer *tok = NULL;
    gdn_generation_result *res = NULL;
    gdn_speculative *spec = NULL;
    gdn_sampler *sampler = NULL;
    gdn_context_params cp = gdn_context_default_params();
    gdn_generation_params gp = gdn_generation_default_params();
    gdn_speculative_params sp = gdn_speculative_default_params();
    gdn_generation_info info;
    gdn_token prompt[32], plain[32], got[64], round[4];
    gdn_token *outs[1];
    const gdn_token *tokens = NULL;
    const char *text = NULL;
    int64_t n_prompt = 0, n_plain = 0, n = 0, n_got = 0, count = 0;
    size_t len = 0;
    gdn_seq_id seq = 0;
    collected col;
    int r;

    EXPECT(gdn_model_load(tiny_dir, NULL, &model) == GDN_STATUS_OK);
    EXPECT(gdn_tokenizer_load_model_dir(tiny_dir, &tok) == GDN_STATUS_OK);
    if (model == NULL || tok == NULL) return;
    cp.max_sequences = 2;
    cp.max_context = 128;
    cp.threads = 2;
    cp.max_rollback_tokens = 4;
    EXPECT(gdn_context_create(model, &cp, &ctx) == GDN_STATUS_OK);
    if (ctx == NULL) return;
    EXPECT(gdn_tokenizer_encode(tok, "reverse 12478 =", 15, 0, prompt, 32, &n_prompt) == GDN_STATUS_OK);

    /* Plain greedy: the trained answer, streamed in pieces that add up to the text. */
    gp.max_tokens = 16;
    memset(&col, 0, sizeof col);
    EXPECT(gdn_generate(ctx, tok, prompt, n_prompt, &gp, collect, &col, &res) == GDN_STATUS_OK);
    if (res == NULL) return;
    EXPECT(gdn_generation_result_text(res, 0, &text, &len) == GDN_STATUS_OK);
    EXPECT(strcmp(text, "87421") == 0 && len == 5);
    EXPECT(strcmp(col.text, "87421") == 0 && col.calls >= 2);
    EXPECT(gdn_generation_result_tokens(res, 0, &tokens, &n_plain) == GDN_STATUS_OK);
    EXPECT(n_plain == 6 && tokens[5] == 0); /* "87421" and eos */
    if (n_plain > 32) n_plain = 32;
    memcpy(plain, tokens, (size_t)n_plain * sizeof *plain);
    info.size = sizeof info;
    EXPECT(gdn_generation_result_get_info(res, 0, &info) == GDN_STATUS_OK);
    EXPECT(info.finish == GDN_FINISH_STOP_TOKEN && info.prompt_tokens == n_prompt);
    gdn_generation_result_free(res);

    /* A callback returning 0 cancels. */
    memset(&col, 0, sizeof col);
    col.cancel_at = 1;
    EXPECT(gdn_generate(ctx, tok, prompt, n_prompt, &gp, collect, &col, &res) == GDN_STATUS_OK);
    EXPECT(gdn_generation_result_get_info(res, 0, &info) == GDN_STATUS_OK && info.finish == GDN_FINISH_CANCELLED);
    EXPECT(col.calls == 1 && info.generated_tokens < n_plain);
    gdn_generation_result_free(res);

    /* MTP speculative decoding: the same tokens. */
    gp.mtp_draft = 2;
    EXPECT(gdn_generate(ctx, tok, prompt, n_prompt, &gp, NULL, NULL, &res) == GDN_STATUS_OK);
    EXPECT(gdn_generation_result_tokens(res, 0, &tokens, &n) == GDN_STATUS_OK);
    EXPECT(same_ids(tokens, n, plain, n_plain));
    gdn_generation_result_free(res);

    /* The speculative handle, driven here: the same tokens again. */
    sp.max_draft = 3;
    EXPECT(gdn_speculative_create(ctx, &sp, &spec) == GDN_STATUS_OK);
    EXPECT(gdn_sampler_create(NULL, 512, &sampler) == GDN_STATUS_OK);
    EXPECT(gdn_seq_create(ctx, &seq) == GDN_STATUS_OK);
    if (spec == NULL || sampler == NULL) return;
    EXPECT(gdn_speculative_start(spec, seq, prompt, n_prompt, sampler, &got[0]) == GDN_STATUS_OK);
    n_got = 1;
    outs[0] = round;
    while (n_got < 16 && got[n_got - 1] != 0) {
        r = gdn_speculative_advance(spec, &seq, 1, outs, 4, &count);
        EXPECT(r == GDN_STATUS_OK);
        if (r != GDN_STATUS_OK) break;
        memcpy(got + n_got, round, (size_t)count * sizeof *got);
        n_got += count;
    }
    for (n = 0; n < n_got && got[n] != 0; ++n) {}
    EXPECT(same_ids(got, n + 1, plain, n_plain));
    EXPECT(gdn_speculative_finish(spec, seq) == GDN_STATUS_OK);
    EXPECT(gdn_speculative_advance(spec, &seq, 1, outs, 4, &count) == GDN_STATUS_INVALID_SEQUENCE);
    gdn_speculative_free(spec);
    gdn_sampler_free(sampler);

    gdn_context_free(ctx);
    gdn_tokenizer_free(tok);
    gdn_model_free(model);
}

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

    if (argc != 2 && argc != 4) {
        fprintf(stderr, "usage: %s MODEL_DIR [GDN_TINY_DIR QWEN_TOKENIZER_JSON_GZ]\n", argv[0]);
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
    if (argc == 4) {
        test_tokenizer(argv[3]);
        test_generation(argv[2]);
    }
    printf("%d passed, %d failed\n", passed, failed);
    return failed == 0 ? 0 : 1;
}
