/* The network engine's control channel (_netcore.h: CTRL_TAG): the standing receive the engine thread keeps
   posted, what arrives on it (a peer's goodbye answered at once, abort and survey messages queued for
   Python, an abort also failing what is in flight), and the control message a caller or the engine sends. */
#include "_netcore.h"

#include <string.h>

/* a control message (kind, who, seq) arrived (1), or the standing receive failed (-1) */
static void ctrl_cb(void *req, ucs_status_t st, const ucp_tag_recv_info_t *info, void *ud) {
  (void)req; (void)info;
  engine_t *e = ud;
  e->ctrl_ready = st == UCS_OK ? 1 : -1;
}

void post_ctrl_recv(engine_t *e) {
  ucp_request_param_t prm;
  memset(&prm, 0, sizeof prm);
  prm.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_MEMORY_TYPE;
  prm.cb.recv = ctrl_cb;
  prm.user_data = e;
  prm.memory_type = UCS_MEMORY_TYPE_HOST;
  e->ctrl_ready = 0;
  ucs_status_ptr_t r = ucp_tag_recv_nbx(e->worker, e->ctrl_in, sizeof e->ctrl_in, CTRL_TAG, SEQ_MASK, &prm);
  if (r == NULL) e->ctrl_ready = 1;
  else if (UCS_PTR_IS_ERR(r)) { e->ctrl_req = NULL; e->ctrl_ready = -2; }
  else e->ctrl_req = r;
}

/* the control messages that arrived, each copied to the ring (or answered), the receive posted again */
int ctrl_progress(engine_t *e) {
  int n = 0;
  while (e->ctrl_ready) {
    if (e->ctrl_ready == -2) return n;  /* could not post: control messages are off */
    int64_t kind = e->ctrl_in[0], who = e->ctrl_in[1];
    if (e->ctrl_ready == 1 && (kind == CTRL_CLOSING || kind == CTRL_CLOSED)) {
      if (who >= 0 && who < e->size && who != e->rank) {
        if (kind == CTRL_CLOSED) {
          atomic_store(&e->confirmed[who], 1);
        } else {
          /* everything ``who`` sent before its goodbye has been read (one connection, in order): confirm */
          atomic_store(&e->closing[who], 1);
          batch_t *r = engine_ctrl_batch(e, (int)who, CTRL_CLOSED, e->rank, 0);
          if (r) submit_to(e, r, 0, 0);
        }
      }
    } else if (e->ctrl_ready == 1) {
      int t = atomic_load(&e->ctrl_tail);
      if (t - atomic_load(&e->ctrl_head) < CTRL_RING) {
        memcpy(e->ctrl_ring[t % CTRL_RING], e->ctrl_in, sizeof e->ctrl_in);
        atomic_store(&e->ctrl_tail, t + 1);
      }
      if (e->ctrl_in[0] == 1) {  /* ABORT: fail what waits, at once */
        int none = -1;
        atomic_compare_exchange_strong(&e->aborted_by, &none, (int)e->ctrl_in[1]);
        atomic_store(&e->aborting, 1);
      }
    }
    if (e->ctrl_req) { ucp_request_free(e->ctrl_req); e->ctrl_req = NULL; }
    post_ctrl_recv(e);
    n++;
  }
  return n;
}

/* a control message (kind, who, seq) to ``peer``, not yet submitted: an abort does not cancel it */
batch_t *engine_ctrl_batch(engine_t *e, int peer, int64_t kind, int64_t who, int64_t seq) {
  batch_t *b = batch_new(1, BK_OP);
  if (!b) return NULL;
  b->ctrl[0] = kind; b->ctrl[1] = who; b->ctrl[2] = seq;
  b->isctrl = 1;
  op_t *o = &b->ops[0];
  o->kind = K_SEND; o->peer = peer; o->buf = (char *)b->ctrl; o->len = sizeof b->ctrl;
  o->tag = ((uint64_t)e->rank << RANK_SHIFT) | CTRL_TAG;
  b->timeout = 5.0;
  return b;
}
