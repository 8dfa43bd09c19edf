/* codec_shape.h - the codec's shape that the kernels (codec.cuh, compiled by nvcc and, for the
 * stand-in driver, by the C++ compiler) and their launcher (kernels.c) must agree on: plain
 * macros, so that every compiler reads the same numbers. */
#ifndef HOOP_MEM_CUDA_CODEC_SHAPE_H
#define HOOP_MEM_CUDA_CODEC_SHAPE_H

/* Elements a scale covers: hoop.h's HOOP_COMPRESS_BLOCK (kernels.c checks that they agree). */
#define HOOP__CODEC_BLOCK 128
/* Threads that find one block's largest magnitude: a warp on the GPU. */
#define HOOP__CODEC_WARP 32

#endif
