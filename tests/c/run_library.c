/* Runs one float32 entry point of a tlc library the way a C program would, for
 * tests/test_codegen_emulated.py, which runs it under an emulated CPU (qemu-x86_64 -cpu NAME):
 *
 *     run_library LIB.so SYMBOL THREADS IN.bin OUT.bin
 *
 * reads the input (raw float32, the size the library's tlc_g_input_rank/_shape give) from
 * IN.bin, sets the library's thread count, asks the library which CPU variant it would run
 * (tlc_g_cpu_check, tlc_g_cpu_variant), calls the entry and writes the output buffer (zeros
 * before the call) to OUT.bin. Prints one line, "check C missing M variant V status S" (M and
 * V are "-" when NULL), and exits 0; 2 when the library or a symbol cannot be loaded. */

#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

typedef int (*entry_fn)(const float *in, float *out);
typedef int (*check_fn)(const char **missing);
typedef const char *(*variant_fn)(void);
typedef int (*rank_fn)(void);
typedef int (*shape_fn)(int64_t *dims);
typedef int (*threads_fn)(int n);

static void *symbol(void *library, const char *graph, const char *suffix) {
    char name[512];
    snprintf(name, sizeof name, "%s%s", graph, suffix);
    void *found = dlsym(library, name);
    if (found == NULL) {
        fprintf(stderr, "run_library: no symbol %s\n", name);
        exit(2);
    }
    return found;
}

static int64_t elements(void *library, const char *graph, const char *which) {
    char rank_name[64], shape_name[64];
    snprintf(rank_name, sizeof rank_name, "_%s_rank", which);
    snprintf(shape_name, sizeof shape_name, "_%s_shape", which);
    int rank = ((rank_fn)symbol(library, graph, rank_name))();
    int64_t shape[16];
    if (rank > 16 || ((shape_fn)symbol(library, graph, shape_name))(shape) != 0) exit(2);
    int64_t n = 1;
    for (int i = 0; i < rank; i++) n *= shape[i];
    return n;
}

int main(int argc, char **argv) {
    if (argc != 6) {
        fprintf(stderr, "usage: run_library LIB.so SYMBOL THREADS IN.bin OUT.bin\n");
        return 2;
    }
    void *library = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (library == NULL) {
        fprintf(stderr, "run_library: %s\n", dlerror());
        return 2;
    }
    const char *graph = argv[2];
    int64_t n_in = elements(library, graph, "input"), n_out = elements(library, graph, "output");
    float *in = calloc((size_t)n_in, sizeof *in), *out = calloc((size_t)n_out, sizeof *out);
    FILE *f = fopen(argv[4], "rb");
    if (in == NULL || out == NULL || f == NULL || fread(in, sizeof *in, (size_t)n_in, f) != (size_t)n_in) {
        fprintf(stderr, "run_library: cannot read %lld floats from %s\n", (long long)n_in, argv[4]);
        return 2;
    }
    fclose(f);
    ((threads_fn)dlsym(library, "tlc_set_num_threads"))(atoi(argv[3]));
    const char *missing = NULL;
    int check = ((check_fn)symbol(library, graph, "_cpu_check"))(&missing);
    const char *variant = ((variant_fn)symbol(library, graph, "_cpu_variant"))();
    int status = ((entry_fn)symbol(library, graph, ""))(in, out);
    printf("check %d missing %s variant %s status %d\n", check, missing ? missing : "-",
           variant ? variant : "-", status);
    f = fopen(argv[5], "wb");
    if (f == NULL || fwrite(out, sizeof *out, (size_t)n_out, f) != (size_t)n_out) {
        fprintf(stderr, "run_library: cannot write %s\n", argv[5]);
        return 2;
    }
    fclose(f);
    return 0;
}
