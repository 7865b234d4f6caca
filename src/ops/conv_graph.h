/*
 * conv_graph.h - weft_conv2d through cuDNN's graph API (conv_graph.c),
 * the path conv_cudnn.c tries first. With cuDNN only.
 */
#ifndef WEFT_OPS_CONV_GRAPH_H
#define WEFT_OPS_CONV_GRAPH_H

#include <stddef.h>

#include <cudnn.h>

#include "ops/conv.h"

/* weft__conv_graph's answer when no engine of the graph takes the call:
 * the caller runs it the legacy way. Not a weft error code. */
enum { WEFT__CONV_GRAPH_DECLINED = 1 };

/* Enqueues act(conv(in, w) + bias) on h's stream (set by the caller) as
 * one cuDNN operation graph, with workspace ws of ws_size bytes (NULL, 0
 * inside a capture). WEFT_OK; WEFT__CONV_GRAPH_DECLINED, with nothing
 * enqueued, when the graph path is off or none of its engines takes the
 * shape (weft__conv_graph_why says why); or an error. */
int weft__conv_graph(cudnnHandle_t h, int device, const weft__conv_args *a, void *ws,
                     size_t ws_size);

#endif
