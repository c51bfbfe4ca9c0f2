/*
 * step-int.h - what step.c (the step state machine) offers step-queue.c
 * (the collectives within a step), which drives it: a collective that
 * runs, completes or fails moves the step, and step.c never calls the
 * queue (tools/calls.py --check daemon). The rest of the daemon uses
 * dmn-int.h.
 */
#ifndef RINGD_DMN_STEP_INT_H
#define RINGD_DMN_STEP_INT_H

#include "daemon/dmn-int.h"

/* The one transition function of the step state (step.c). */
void dmn__step_set_state(dmn_t *d, dmn_step_state_t to);
/* The step cannot complete: BROKEN now, or ABORTING while a collective
 * is with the backend (BROKEN when it comes back). */
void dmn__step_break(dmn_t *d);
/* Close the step once every trainer has left it. */
void dmn__step_maybe_close(dmn_t *d);
/* c leaves the step it is in to redo it: the step cannot complete. */
void dmn__step_leave_to_redo(dmn_t *d, dmn_conn_t *c);

/* Answer c's queued collectives from the keep-th on. */
void dmn__step_answer_queue(dmn_conn_t *c, uint32_t keep, int32_t status);
/* Answer every pending collective with status; redo: void the step. */
void dmn__step_fail_posted(dmn_t *d, int32_t status, int redo);

#endif
