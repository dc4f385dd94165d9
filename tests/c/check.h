/* The checks the C tests share: EXPECT counts a passed or failed condition (printing the
 * failure with the library's last error), OK expects TNN_OK. Each test ends with
 * `printf("%d passed, %d failed\n", passed, failed)`. */
#ifndef TINYNN_TEST_CHECK_H
#define TINYNN_TEST_CHECK_H

#include <stdio.h>

#include "tinynn.h"

static int passed = 0, failed = 0;

#define EXPECT(cond, ...)                                                        \
    do {                                                                         \
        if (cond) {                                                              \
            passed++;                                                            \
        } else {                                                                 \
            failed++;                                                            \
            fprintf(stderr, "FAILED line %d: %s: ", __LINE__, #cond);            \
            fprintf(stderr, __VA_ARGS__);                                        \
            fprintf(stderr, " (last error: %s)\n", tnn_last_error());           \
        }                                                                        \
    } while (0)

#define OK(call) EXPECT((call) == TNN_OK, "%s", #call)

#endif
