/* tinynn's C API contract on a real model: `api MODEL [ADAPTER]`. Checks info, tokenize /
 * detokenize, eval and ragged decode (two sequences together = each alone), truncate / clear /
 * copy, samplers, the generation callback stopping, embeddings, LoRA (scale 0 = the base, a
 * trained adapter moves the logits), and that null, freed, wrong-kind handles and bad
 * arguments are errors with messages, not crashes. Prints "N passed, 0 failed". */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"


static int32_t argmax(const float *v, size_t n) {
    size_t best = 0;
    for (size_t i = 1; i < n; i++)
        if (v[i] > v[best]) best = i;
    return (int32_t)best;
}

static float max_diff(const float *a, const float *b, size_t n) {
    float d = 0;
    for (size_t i = 0; i < n; i++) {
        float x = fabsf(a[i] - b[i]);
        if (x > d) d = x;
    }
    return d;
}

typedef struct {
    int calls;
    int stop_after;
    char text[4096];
    size_t len;
} Collect;

static int32_t collect(const char *text, size_t len, int32_t token, void *user) {
    Collect *c = user;
    (void)token;
    if (c->len + len < sizeof c->text) {
        memcpy(c->text + c->len, text, len);
        c->len += len;
        c->text[c->len] = 0;
    }
    c->calls++;
    return c->stop_after > 0 && c->calls >= c->stop_after;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: api MODEL [ADAPTER]\n");
        return 2;
    }
    EXPECT(strlen(tnn_version()) >= 5, "version %s", tnn_version());

    /* Opening: a missing file and null arguments are errors with messages. */
    TnnModel *model = NULL;
    EXPECT(tnn_model_open("/nonexistent/model.gguf", &model) != TNN_OK && model == NULL, "missing file");
    EXPECT(strstr(tnn_last_error(), "/nonexistent/model.gguf") != NULL, "the message names the path");
    EXPECT(tnn_model_open(NULL, &model) == TNN_ERR_NULL, "null path");
    EXPECT(tnn_model_open(argv[1], NULL) == TNN_ERR_NULL, "null out");
    OK(tnn_model_open(argv[1], &model));
    EXPECT(strcmp(tnn_last_error(), "") == 0, "success clears the message");

    TnnModelInfo info;
    OK(tnn_model_info(model, &info));
    EXPECT(info.n_vocab > 1000 && info.n_layer > 0 && info.n_embd > 0 && info.n_params > 1000000,
           "info %llu %llu %llu %llu", (unsigned long long)info.n_vocab,
           (unsigned long long)info.n_layer, (unsigned long long)info.n_embd,
           (unsigned long long)info.n_params);
    EXPECT(tnn_model_architecture(model) && strlen(tnn_model_architecture(model)) > 0, "architecture");

    /* Tokenize / detokenize, with a buffer too small first. */
    const char *text = "The quick brown fox jumps over the lazy dog.";
    int32_t ids[256];
    size_t n_ids = 0;
    EXPECT(tnn_tokenize(model, text, false, ids, 2, &n_ids) == TNN_ERR_BUFFER_TOO_SMALL && n_ids > 2,
           "small buffer gives the count (%zu)", n_ids);
    OK(tnn_tokenize(model, text, false, ids, 256, &n_ids));
    char back[512];
    size_t n_bytes = 0;
    EXPECT(tnn_detokenize(model, ids, n_ids, back, 4, &n_bytes) == TNN_ERR_BUFFER_TOO_SMALL &&
               n_bytes == strlen(text) + 1,
           "small text buffer gives the size (%zu)", n_bytes);
    OK(tnn_detokenize(model, ids, n_ids, back, sizeof back, &n_bytes));
    EXPECT(strcmp(back, text) == 0 && n_bytes == strlen(text), "round trip: '%s'", back);
    int32_t bad_id = 1 << 30;
    EXPECT(tnn_detokenize(model, &bad_id, 1, back, sizeof back, &n_bytes) == TNN_ERR_INVALID, "bad id");

    /* A session of two sequences: eval, ragged decode, and each alone. */
    TnnSessionParams sp = tnn_session_default_params();
    sp.n_ctx = 256;
    sp.n_seq = 2;
    sp.n_threads = 2;
    TnnSession *s = NULL;
    OK(tnn_session_new(model, &sp, &s));
    int32_t prompt[256];
    size_t n_prompt = 0;
    OK(tnn_tokenize(model, "Once upon a time", true, prompt, 256, &n_prompt));
    const float *logits = NULL;
    size_t n_vocab = 0;
    OK(tnn_session_eval(s, 0, prompt, n_prompt, &logits, &n_vocab));
    EXPECT(n_vocab == info.n_vocab, "row length %zu", n_vocab);
    float *alone = malloc(n_vocab * sizeof(float));
    memcpy(alone, logits, n_vocab * sizeof(float));
    int32_t next = argmax(alone, n_vocab);
    size_t len = 0;
    OK(tnn_session_seq_len(s, 0, &len));
    EXPECT(len == n_prompt, "sequence 0 holds %zu", len);

    /* Sequence 1 takes the same prompt in a batch with sequence 0's next token. */
    TnnBatchToken batch[257];
    for (size_t i = 0; i < n_prompt; i++) {
        batch[i].token = prompt[i];
        batch[i].seq = 1;
        batch[i].logits = i + 1 == n_prompt;
    }
    batch[n_prompt].token = next;
    batch[n_prompt].seq = 0;
    batch[n_prompt].logits = true;
    OK(tnn_session_decode(s, batch, n_prompt + 1));
    size_t n_out = 0;
    OK(tnn_session_n_outputs(s, &n_out));
    EXPECT(n_out == 2, "two output rows, got %zu", n_out);
    const float *row = NULL;
    OK(tnn_session_output(s, 0, &row, &n_vocab));
    EXPECT(row && max_diff(row, alone, n_vocab) < 1e-3f, "sequence 1 in a batch = sequence 0 alone (%g)",
           row ? max_diff(row, alone, n_vocab) : -1.0);
    EXPECT(tnn_session_output(s, 2, &row, &n_vocab) == TNN_ERR_INVALID, "no third row");

    /* A bad token fails and leaves the sequence as it was; an unknown sequence is refused. */
    int32_t bad = (int32_t)info.n_vocab + 5;
    EXPECT(tnn_session_eval(s, 0, &bad, 1, &logits, &n_vocab) != TNN_OK, "token past the vocabulary");
    OK(tnn_session_seq_len(s, 0, &len));
    EXPECT(len == n_prompt + 1, "sequence 0 unchanged: %zu", len);
    EXPECT(tnn_session_eval(s, 7, prompt, 1, &logits, &n_vocab) == TNN_ERR_INVALID, "sequence 7");
    EXPECT(tnn_session_eval(s, 0, prompt, 0, &logits, &n_vocab) == TNN_ERR_INVALID, "no tokens");

    /* Truncate back to the prompt and run the same token again: the same logits. */
    OK(tnn_session_truncate(s, 0, n_prompt));
    OK(tnn_session_eval(s, 0, &next, 1, &logits, &n_vocab));
    float *again = malloc(n_vocab * sizeof(float));
    memcpy(again, logits, n_vocab * sizeof(float));
    OK(tnn_session_clear(s, 1));
    OK(tnn_session_copy(s, 0, 1, n_prompt));
    OK(tnn_session_eval(s, 1, &next, 1, &logits, &n_vocab));
    EXPECT(max_diff(logits, again, n_vocab) < 1e-3f, "a copied prefix continues alike");
    OK(tnn_session_seq_len(s, 1, &len));
    EXPECT(len == n_prompt + 1, "sequence 1 holds %zu", len);

    /* The context fills: an error of its own kind. */
    int32_t many[300];
    for (int i = 0; i < 300; i++) many[i] = prompt[i % n_prompt];
    EXPECT(tnn_session_eval(s, 0, many, 300, &logits, &n_vocab) == TNN_ERR_CONTEXT_FULL, "context full");

    /* Samplers: greedy = argmax; the same seed draws the same tokens. */
    TnnSampler *greedy = NULL;
    OK(tnn_sampler_new(NULL, &greedy));
    int32_t tok = -1;
    OK(tnn_sampler_sample(greedy, alone, n_vocab, &tok));
    EXPECT(tok == next, "greedy %d vs argmax %d", tok, next);
    TnnSampleParams warm = tnn_sample_default_params();
    warm.temperature = 0.9f;
    warm.seed = 42;
    int32_t draws[2][8];
    for (int k = 0; k < 2; k++) {
        TnnSampler *smp = NULL;
        OK(tnn_sampler_new(&warm, &smp));
        for (int i = 0; i < 8; i++) OK(tnn_sampler_sample(smp, alone, n_vocab, &draws[k][i]));
        OK(tnn_sampler_free(smp));
    }
    EXPECT(memcmp(draws[0], draws[1], sizeof draws[0]) == 0, "seeded draws repeat");
    TnnSampleParams broken = warm;
    broken.top_p = 2.0f;
    TnnSampler *nope = NULL;
    EXPECT(tnn_sampler_new(&broken, &nope) == TNN_ERR_INVALID && nope == NULL, "top_p 2 refused");

    /* Generation: the first token is greedy's; the callback stops it. */
    OK(tnn_session_clear(s, 0));
    Collect c = {0};
    c.stop_after = 3;
    TnnGenerateParams gp = tnn_generate_default_params();
    gp.max_tokens = 20;
    TnnFinish fin = TNN_FINISH_LENGTH;
    OK(tnn_generate(s, "Once upon a time", &gp, collect, &c, &fin));
    EXPECT(fin == TNN_FINISH_CALLBACK && c.calls == 3, "stopped after %d pieces (finish %d)", c.calls, (int)fin);
    const char *stops[] = {"the"};
    gp.stop = stops;
    gp.n_stop = 1;
    Collect c2 = {0};
    OK(tnn_generate(s, "Count: one, two, three, four, five", &gp, collect, &c2, &fin));
    EXPECT(fin == TNN_FINISH_STOP || fin == TNN_FINISH_LENGTH || fin == TNN_FINISH_END_TOKEN, "finish %d", (int)fin);
    EXPECT(strstr(c2.text, "the") == NULL, "stop string not output: '%s'", c2.text);

    /* Embeddings: the model's width, unit length. */
    float emb[4096];
    size_t n_emb = 0;
    OK(tnn_session_embed(s, "hello world", 0, emb, 4096, &n_emb));
    double norm = 0;
    for (size_t i = 0; i < n_emb; i++) norm += (double)emb[i] * emb[i];
    EXPECT(n_emb == info.n_embd && fabs(norm - 1.0) < 1e-3, "embedding %zu values, norm %g", n_emb, norm);
    EXPECT(tnn_session_embed(s, "x", 5, emb, 4096, &n_emb) == TNN_ERR_INVALID, "pooling 5");

    /* LoRA: scale 0 is the base; a trained adapter moves the logits. */
    if (argc > 2) {
        TnnLora *lora = NULL;
        OK(tnn_lora_open(argv[2], &lora));
        const TnnLora *list[1] = {lora};
        float zero = 0.0f, one = 1.0f;
        OK(tnn_session_set_lora(s, list, &zero, 1));
        OK(tnn_session_eval(s, 0, prompt, n_prompt, &logits, &n_vocab));
        EXPECT(max_diff(logits, alone, n_vocab) < 1e-3f, "scale 0 = base (%g)", max_diff(logits, alone, n_vocab));
        OK(tnn_session_set_lora(s, list, &one, 1));
        OK(tnn_session_eval(s, 0, prompt, n_prompt, &logits, &n_vocab));
        EXPECT(max_diff(logits, alone, n_vocab) > 1e-3f, "scale 1 moves the logits (%g)", max_diff(logits, alone, n_vocab));
        OK(tnn_lora_free(lora));
        OK(tnn_session_eval(s, 0, prompt, 1, &logits, &n_vocab)); /* the session keeps it */
        OK(tnn_session_set_lora(s, NULL, NULL, 0));
        EXPECT(tnn_lora_open("/nonexistent.gguf", &lora) != TNN_OK, "missing adapter");
    }

    /* Handles: wrong kind, freed, null, foreign. */
    EXPECT(tnn_session_clear((TnnSession *)model, 0) == TNN_ERR_HANDLE, "a model is not a session");
    EXPECT(tnn_model_info((TnnModel *)s, &info) == TNN_ERR_HANDLE, "a session is not a model");
    int dummy = 0;
    EXPECT(tnn_session_clear((TnnSession *)&dummy, 0) == TNN_ERR_HANDLE, "a foreign pointer");
    EXPECT(tnn_session_clear(NULL, 0) == TNN_ERR_NULL, "null session");
    OK(tnn_sampler_free(greedy));
    EXPECT(tnn_sampler_sample(greedy, alone, n_vocab, &tok) == TNN_ERR_HANDLE, "a freed sampler");
    EXPECT(tnn_sampler_free(greedy) == TNN_ERR_HANDLE, "freed twice");
    OK(tnn_session_free(s));
    OK(tnn_model_free(model));
    EXPECT(tnn_model_info(model, &info) == TNN_ERR_HANDLE, "a freed model");
    OK(tnn_model_free(NULL));
    free(alone);
    free(again);

    printf("%d passed, %d failed\n", passed, failed);
    return failed == 0 ? 0 : 1;
}
