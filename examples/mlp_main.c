#include <stdio.h>
#include "libmlp.h"

int main(void) {
    const float x[TLC_MLP_INPUT_SIZE] = {0.3f, -0.2f, 0.1f, 0.4f};
    float y[TLC_MLP_OUTPUT_SIZE];
    int status = tlc_mlp(x, y);
    if (status != TLC_OK) {
        fprintf(stderr, "tlc_mlp failed with status %d\n", status);
        return 1;
    }
    printf("G(x0) = %.6f\n", y[0]);
    printf("null input -> status %d\n", tlc_mlp(NULL, y));
    return 0;
}
