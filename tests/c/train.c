/* Training through tinynn's C API: `train MODEL TEXT_FILE WORK_DIR [FULL_MODEL]`.
 * LoRA on MODEL: the loss falls over 8 steps; a checkpoint after step 4 resumed in a new
 * trainer gives steps 5-8 bit for bit; the exported adapter loads into a session and moves
 * its logits. With FULL_MODEL (a small model): full fine-tuning with SGD, exported as GGUF,
 * which opens and runs. Bad settings are errors. Prints "N passed, 0 failed". */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"


enum { SEQ = 32, STEPS = 8 };

static char *read_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    static char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    return buf;
}

/* Steps `from`..`to` (1-based) of the run, each on its own window of the text. */
static void run_steps(TnnTrainer *t, const int32_t *ids, size_t n_ids, int from, int to, float *losses) {
    for (int s = from; s <= to; s++) {
        size_t at = ((size_t)(s - 1) * SEQ) % (n_ids - SEQ);
        bool skipped = true;
        OK(tnn_trainer_step(t, ids + at, NULL, SEQ, &losses[s - 1], &skipped));
        EXPECT(!skipped && isfinite(losses[s - 1]), "step %d", s);
    }
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: train MODEL TEXT_FILE WORK_DIR [FULL_MODEL]\n");
        return 2;
    }
    const char *text = read_file(argv[2]);
    EXPECT(text != NULL, "reading %s", argv[2]);
    if (!text) return 1;
    TnnModel *model = NULL;
    OK(tnn_model_open(argv[1], &model));
    static int32_t ids[1 << 14];
    size_t n_ids = 0;
    OK(tnn_tokenize(model, text, false, ids, 1 << 14, &n_ids));
    EXPECT(n_ids > 4 * SEQ, "%zu tokens", n_ids);

    TnnTrainParams tp = tnn_train_default_params();
    tp.seq = SEQ;
    tp.batch = 1;
    tp.n_threads = 2;
    tp.lora_rank = 4;
    tp.lr = 3e-3f;
    tp.seed = 7;
    tp.lora_targets = "q,k,v,o";

    /* Bad settings. */
    TnnTrainer *t = NULL;
    TnnTrainParams bad = tp;
    bad.seq = 0;
    EXPECT(tnn_trainer_new(model, &bad, &t) == TNN_ERR_INVALID && t == NULL, "seq 0");
    bad = tp;
    bad.lora_targets = "q,nope";
    EXPECT(tnn_trainer_new(model, &bad, &t) == TNN_ERR_TRAIN && strstr(tnn_last_error(), "nope"), "bad target");
    bad = tp;
    bad.optimizer = 9;
    EXPECT(tnn_trainer_new(model, &bad, &t) == TNN_ERR_INVALID, "optimizer 9");

    /* A warmup + cosine schedule: half the rate at step 0, the peak after the warmup, the
     * floor at the end; set_lr replaces it by a constant rate. */
    TnnTrainParams sched = tp;
    sched.schedule = 1;
    sched.lr = 1e-2f;
    sched.min_lr = 1e-3f;
    sched.warmup_steps = 2;
    sched.total_steps = 4;
    OK(tnn_trainer_new(model, &sched, &t));
    float r0 = 0, r2 = 0, r4 = 0, rc = 0;
    OK(tnn_trainer_get_lr(t, &r0));
    float unused[4];
    run_steps(t, ids, n_ids, 1, 2, unused);
    OK(tnn_trainer_get_lr(t, &r2));
    run_steps(t, ids, n_ids, 3, 4, unused);
    OK(tnn_trainer_get_lr(t, &r4));
    OK(tnn_trainer_set_lr(t, 2e-3f));
    OK(tnn_trainer_get_lr(t, &rc));
    EXPECT(fabsf(r0 - 5e-3f) < 1e-7f && fabsf(r2 - 1e-2f) < 1e-7f && fabsf(r4 - 1e-3f) < 1e-7f && rc == 2e-3f,
           "schedule %g %g %g, then %g", r0, r2, r4, rc);
    OK(tnn_trainer_free(t));
    bad = sched;
    bad.warmup_steps = 9;
    EXPECT(tnn_trainer_new(model, &bad, &t) == TNN_ERR_INVALID, "warmup past the end");

    /* Eight steps; a checkpoint after the fourth. */
    OK(tnn_trainer_new(model, &tp, &t));
    float lr = 0;
    OK(tnn_trainer_get_lr(t, &lr));
    EXPECT(lr == 3e-3f, "lr %g", lr);
    EXPECT(tnn_trainer_step(t, ids, NULL, SEQ - 1, NULL, NULL) == TNN_ERR_INVALID, "a short batch");
    float held_before = 0, held_after = 0;
    OK(tnn_trainer_eval_loss(t, ids + n_ids - SEQ, NULL, SEQ, &held_before));
    float losses[STEPS], resumed[STEPS];
    run_steps(t, ids, n_ids, 1, 4, losses);
    char dir[1024], path[1024];
    snprintf(dir, sizeof dir, "%s/ckpt", argv[3]);
    OK(tnn_trainer_save(t, dir, path, sizeof path));
    EXPECT(strstr(path, "checkpoint-4.gguf") != NULL, "checkpoint path %s", path);
    run_steps(t, ids, n_ids, 5, STEPS, losses);
    uint64_t steps = 0;
    OK(tnn_trainer_steps(t, &steps));
    EXPECT(steps == STEPS, "%llu steps", (unsigned long long)steps);
    OK(tnn_trainer_eval_loss(t, ids + n_ids - SEQ, NULL, SEQ, &held_after));
    EXPECT(held_after < held_before, "held-out loss %g -> %g", held_before, held_after);
    float first = (losses[0] + losses[1]) / 2, last = (losses[STEPS - 2] + losses[STEPS - 1]) / 2;
    EXPECT(last < first, "loss %g -> %g", first, last);
    char adapter[1024];
    snprintf(adapter, sizeof adapter, "%s/adapter.gguf", argv[3]);
    OK(tnn_trainer_export(t, adapter, false));
    OK(tnn_trainer_free(t));

    /* A new trainer resumed from the checkpoint takes steps 5-8 exactly as the first did. */
    TnnTrainer *t2 = NULL;
    OK(tnn_trainer_new(model, &tp, &t2));
    OK(tnn_trainer_set_lr(t2, 1.0f)); /* the checkpoint's rate comes back */
    OK(tnn_trainer_resume(t2, dir));
    OK(tnn_trainer_get_lr(t2, &lr));
    EXPECT(lr == 3e-3f, "resumed lr %g", lr);
    run_steps(t2, ids, n_ids, 5, STEPS, resumed);
    EXPECT(memcmp(losses + 4, resumed + 4, 4 * sizeof(float)) == 0, "resumed losses %g %g vs %g %g",
           resumed[4], resumed[7], losses[4], losses[7]);
    OK(tnn_trainer_free(t2));
    TnnTrainParams other = tp;
    other.lora_rank = 2;
    OK(tnn_trainer_new(model, &other, &t2));
    EXPECT(tnn_trainer_resume(t2, dir) == TNN_ERR_TRAIN, "a checkpoint of other settings");
    OK(tnn_trainer_free(t2));

    /* The adapter loads and moves the logits. */
    TnnSession *s = NULL;
    OK(tnn_session_new(model, NULL, &s));
    const float *logits = NULL;
    size_t n_vocab = 0;
    OK(tnn_session_eval(s, 0, ids, 16, &logits, &n_vocab));
    float *base = malloc(n_vocab * sizeof(float));
    memcpy(base, logits, n_vocab * sizeof(float));
    TnnLora *lora = NULL;
    OK(tnn_lora_open(adapter, &lora));
    float one = 1.0f;
    const TnnLora *list[1] = {lora};
    OK(tnn_session_set_lora(s, list, &one, 1));
    OK(tnn_session_eval(s, 0, ids, 16, &logits, &n_vocab));
    float d = 0;
    for (size_t i = 0; i < n_vocab; i++) d = fmaxf(d, fabsf(logits[i] - base[i]));
    EXPECT(d > 1e-3f, "the adapter moves the logits by %g", d);
    OK(tnn_lora_free(lora));
    OK(tnn_session_free(s));
    free(base);

    /* Full fine-tuning of a small model with SGD, exported and reopened. */
    if (argc > 4) {
        TnnModel *small = NULL;
        OK(tnn_model_open(argv[4], &small));
        TnnTrainParams fp = tnn_train_default_params();
        fp.lora = false;
        fp.optimizer = 1;
        fp.seq = 16;
        fp.batch = 2;
        fp.lr = 0.05f;
        TnnTrainer *ft = NULL;
        OK(tnn_trainer_new(small, &fp, &ft));
        int32_t batch[32];
        for (int i = 0; i < 32; i++) batch[i] = (i * 7 + 3) % 200;
        float l0 = 0, l = 0;
        for (int step = 0; step < 6; step++) {
            OK(tnn_trainer_step(ft, batch, NULL, 32, step == 0 ? &l0 : &l, NULL));
        }
        EXPECT(l < l0, "full fine-tuning loss %g -> %g", l0, l);
        char out[1024];
        snprintf(out, sizeof out, "%s/full.gguf", argv[3]);
        OK(tnn_trainer_export(ft, out, false));
        OK(tnn_trainer_free(ft));
        TnnModel *tuned = NULL;
        OK(tnn_model_open(out, &tuned));
        TnnSession *ts = NULL;
        OK(tnn_session_new(tuned, NULL, &ts));
        OK(tnn_session_eval(ts, 0, batch, 8, &logits, &n_vocab));
        OK(tnn_session_free(ts));
        OK(tnn_model_free(tuned));
        OK(tnn_model_free(small));
    }
    OK(tnn_model_free(model));
    printf("%d passed, %d failed\n", passed, failed);
    return failed == 0 ? 0 : 1;
}
