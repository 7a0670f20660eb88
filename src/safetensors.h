/* safetensors.h — mmap a .safetensors file, parse and validate its header, look tensors up by
 * name. Knows nothing about Qwen. Every header entry is checked: dtype known, offsets inside
 * the data section, no overlap, byte size == shape x dtype size. */
#ifndef Q35_SAFETENSORS_H
#define Q35_SAFETENSORS_H

#include <stdint.h>

#include "util.h"

/* DT_F8_E4M3: "F8_E4M3", torch.float8_e4m3fn (util.h), 1 byte. */
typedef enum { DT_BF16 = 0, DT_F16 = 1, DT_F32 = 2, DT_I32 = 3, DT_I64 = 4, DT_U8 = 5, DT_F8_E4M3 = 6 } DType;
#define ST_MAX_DIMS 8

typedef struct Tensor {
    const char *name; /* full name as stored in the file */
    DType dtype;
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    int64_t numel;
    const void *data; /* into the mmap (or owned memory for dummy weights); the file does not
                       * guarantee alignment, model_load copies misaligned bound tensors */
    size_t nbytes;
    /* DT_F8_E4M3 matrices only (model.c binds "<name>_scale_inv"; NULL otherwise): fp32 block scales,
     * row-major (ceil(shape[0]/128), ceil(shape[1]/128)); element (r, c) = fp8[r][c] * scale_inv[r/128][c/128]. */
    const float *scale_inv;
} Tensor;

typedef struct SafeTensors {
    char *path;
    void *map;
    size_t map_len;
    char *header_json; /* copy of the JSON header, NUL-terminated */
    Tensor *tensors;
    int n_tensors;
    char *metadata_json; /* "__metadata__" object as JSON text, or NULL */
} SafeTensors;

int dtype_size(DType t);
const char *dtype_name(DType t);

/* mmaps path read-only and checks the header; errors (Q35_ERR_IO / Q35_ERR_FORMAT) name the file
 * and the tensor. On error st is left zeroed. Tensors are sorted by name. */
int safetensors_open(SafeTensors *st, const char *path, Err *err);
/* Unmaps and frees; safe on a zeroed SafeTensors and idempotent. */
void safetensors_close(SafeTensors *st);
/* Binary search by exact stored name; NULL if absent. */
const Tensor *safetensors_find(const SafeTensors *st, const char *name);

#endif
