/* Greedy text from a model through tinynn's C API, printed as `tnn run --no-display-prompt`
 * prints it: `generate MODEL PROMPT N_TOKENS [THREADS]`. */
#include <stdio.h>
#include <stdlib.h>

#include "tinynn.h"

static int32_t print_piece(const char *text, size_t len, int32_t token, void *user) {
    (void)token;
    size_t *pieces = user;
    *pieces += 1;
    fwrite(text, 1, len, stdout);
    return 0;
}

#define CHECK(call)                                                              \
    do {                                                                         \
        TnnStatus st_ = (call);                                                  \
        if (st_ != TNN_OK) {                                                     \
            fprintf(stderr, "%s failed (%d): %s\n", #call, (int)st_, tnn_last_error()); \
            return 1;                                                            \
        }                                                                        \
    } while (0)

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: generate MODEL PROMPT N_TOKENS [THREADS]\n");
        return 2;
    }
    TnnModel *model = NULL;
    CHECK(tnn_model_open(argv[1], &model));
    TnnSessionParams sp = tnn_session_default_params();
    sp.n_ctx = 1024;
    sp.n_threads = argc > 4 ? (uint32_t)atoi(argv[4]) : 2;
    TnnSession *session = NULL;
    CHECK(tnn_session_new(model, &sp, &session));
    TnnGenerateParams gp = tnn_generate_default_params();
    gp.max_tokens = (uint32_t)atoi(argv[3]);
    gp.ignore_eos = true;
    size_t pieces = 0;
    TnnFinish finish;
    CHECK(tnn_generate(session, argv[2], &gp, print_piece, &pieces, &finish));
    printf("\n");
    fprintf(stderr, "%zu pieces, finish %d\n", pieces, (int)finish);
    CHECK(tnn_session_free(session));
    CHECK(tnn_model_free(model));
    return finish == TNN_FINISH_LENGTH ? 0 : 1;
}
