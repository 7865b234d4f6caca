/*
 * await_check.h - a library beside libweft adds a say to a task's await.
 *
 * Work a sibling library puts on the calling task's stream can fail in a
 * way the device does not see: an NCCL collective whose communicator was
 * aborted (a dead peer, a timeout) ends on the GPU without an error, its
 * result meaningless. libweft_nccl attaches a check to the task for each
 * such operation; when the task's stream has drained (weft_await, or the
 * task's end, whose join then reports it), each check runs and the first
 * failure is the await's result.
 */
#ifndef WEFT_DEVICE_AWAIT_CHECK_H
#define WEFT_DEVICE_AWAIT_CHECK_H

/* Attach check to the calling task's next drain. check(arg) returns
 * WEFT_OK, or a weft code with the message set (weft__fail); it is run
 * only while no earlier check of the same drain has failed. release(arg)
 * runs after it, or instead of it, exactly once; it must not set an error.
 * Task only (WEFT_ENOTASK), and the task must have device work in flight
 * (WEFT_ESTATE): the check rides on that work's drain. On failure release
 * has already run. */
int weft__await_check_add(int (*check)(void *arg), void (*release)(void *arg), void *arg);

#endif
