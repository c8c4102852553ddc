/*
 * Thin C shim over the UCX ucp API for nessie-fabric-ucx.
 *
 * Every function takes plain arguments, so the Rust side never depends on the layout of
 * ucp_*_params_t structures (which change between UCX releases). Blocking operations are
 * implemented here: post the nbx call, then busy-poll the caller's worker with
 * ucp_worker_progress until the request completes, the endpoint fails, or a deadline passes.
 * On a deadline the endpoint is force-closed (which completes every outstanding request on it
 * with an error), so the caller's buffers are never touched by UCX after we return.
 */
#include <ucp/api/ucp.h>
#include <ucs/debug/log_def.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <stdio.h>
#include <time.h>

/* Extra status returned when an operation did not complete before its deadline. */
#define NSH_TIMED_OUT ((int)UCS_ERR_TIMED_OUT)

typedef struct nsh_ep {
    ucp_ep_h ep;              /* NULL once closed */
    volatile int status;      /* UCS_OK, or the error reported by the error callback */
    /* Request memory for this endpoint's (one outstanding) RMA/AMO operation, zeroed before
     * every post (see nsh_req_prepare). */
    void *req_mem;
    size_t req_size;
    /* Operations posted since the worker was last progressed before a post. */
    unsigned posts_since_progress;
    /* A wait that has polled this long without completing sleeps on the worker's event fd
     * (0: never; polling only). See nsh_wait. */
    uint64_t block_after_ns;
} nsh_ep_t;

/* Progress the worker before every NSH_PROGRESS_EVERY-th post (operations that do not complete
 * inline progress it anyway while they wait). A progress call costs about as much as a whole
 * shm READ; doing it on every post tripled small-READ latency. Failure events (keepalive,
 * transport errors) still reach the error callback within a few operations. */
#define NSH_PROGRESS_EVERY 32

/* Size of ucp's internal request, for user-provided request memory. */
size_t nsh_request_size(ucp_context_h ctx)
{
    ucp_context_attr_t attr;
    memset(&attr, 0, sizeof(attr));
    attr.field_mask = UCP_ATTR_FIELD_REQUEST_SIZE;
    if (ucp_context_query(ctx, &attr) != UCS_OK) {
        return 0;
    }
    return attr.request_size;
}

/*
 * Use this endpoint's own, freshly zeroed request memory for the next operation.
 *
 * Why: UCX 1.13 crashes (uct_md_mem_dereg on a garbage memory handle) when it purges an
 * outstanding software-emulated atomic (tcp) after a forced close or a peer failure: the purge
 * deregisters the request's datatype state, which the AMO path never initialises, so a request
 * recycled from UCX's pool carries stale handles. Zeroed user-provided request memory makes
 * that state empty.
 */
static void *nsh_req_prepare(nsh_ep_t *e, ucp_request_param_t *p)
{
    memset(e->req_mem, 0, e->req_size);
    p->op_attr_mask |= UCP_OP_ATTR_FIELD_REQUEST;
    p->request       = (char *)e->req_mem + e->req_size;
    return p->request;
}

static uint64_t nsh_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

const char *nsh_status_string(int status)
{
    return ucs_status_string((ucs_status_t)status);
}

void nsh_version(unsigned *major, unsigned *minor, unsigned *release)
{
    ucp_get_version(major, minor, release);
}

/* ---------------------------------------------------------------- context */

/* ---------------------------------------------------------------- logging */

/* Longest UCX log message we print; longer ones are truncated. */
#define NSH_LOG_LINE_MAX 1024

/*
 * UCX's default log handler writes to UCX_LOG_FILE, which defaults to stdout: its warnings
 * would corrupt machine-readable output (`--json`). This handler, run before the default one,
 * writes every message UCX's log level lets through to stderr instead and stops there.
 */
static ucs_log_func_rc_t nsh_log_to_stderr(const char *file, unsigned line, const char *function,
                                           ucs_log_level_t level,
                                           const ucs_log_component_config_t *comp_conf,
                                           const char *format, va_list ap)
{
    char msg[NSH_LOG_LINE_MAX];
    const char *base = strrchr(file, '/');
    (void)function;
    (void)comp_conf;
    vsnprintf(msg, sizeof(msg), format, ap);
    fprintf(stderr, "UCX %s %s:%u %s\n", ucs_log_level_names[level], base ? base + 1 : file,
            line, msg);
    return UCS_LOG_FUNC_RC_STOP;
}

static pthread_once_t nsh_log_once = PTHREAD_ONCE_INIT;

static void nsh_install_log_handler(void)
{
    ucs_log_push_handler(nsh_log_to_stderr);
}

/* ---------------------------------------------------------------- context (init) */

int nsh_init(const char *const *keys, const char *const *vals, size_t n, int wakeup,
             ucp_context_h *out, char *err, size_t errlen)
{
    ucp_config_t *config;
    ucp_params_t params;
    ucs_status_t status;
    size_t i;

    pthread_once(&nsh_log_once, nsh_install_log_handler);
    status = ucp_config_read(NULL, NULL, &config);
    if (status != UCS_OK) {
        snprintf(err, errlen, "ucp_config_read: %s", ucs_status_string(status));
        return status;
    }
    for (i = 0; i < n; i++) {
        status = ucp_config_modify(config, keys[i], vals[i]);
        if (status != UCS_OK) {
            snprintf(err, errlen, "ucp_config_modify(%s=%s): %s", keys[i], vals[i],
                     ucs_status_string(status));
            ucp_config_release(config);
            return status;
        }
    }

    memset(&params, 0, sizeof(params));
    params.field_mask        = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED |
                               UCP_PARAM_FIELD_NAME;
    params.features          = UCP_FEATURE_RMA | UCP_FEATURE_AMO64 |
                               (wakeup ? UCP_FEATURE_WAKEUP : 0);
    /* Several workers (one per thread) share this context and its memory registrations. */
    params.mt_workers_shared = 1;
    params.name              = "nessie";

    status = ucp_init(&params, config, out);
    ucp_config_release(config);
    if (status != UCS_OK) {
        snprintf(err, errlen, "ucp_init: %s", ucs_status_string(status));
    }
    return status;
}

void nsh_cleanup(ucp_context_h ctx)
{
    ucp_cleanup(ctx);
}

/* ---------------------------------------------------------------- worker */

int nsh_worker_create(ucp_context_h ctx, ucp_worker_h *out)
{
    ucp_worker_params_t params;
    memset(&params, 0, sizeof(params));
    params.field_mask  = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    /* One worker per thread; the Rust wrapper guarantees exclusive access. */
    params.thread_mode = UCS_THREAD_MODE_SINGLE;
    return ucp_worker_create(ctx, &params, out);
}

void nsh_worker_destroy(ucp_worker_h w)
{
    ucp_worker_destroy(w);
}

int nsh_worker_address(ucp_worker_h w, void **addr, size_t *len)
{
    return ucp_worker_get_address(w, (ucp_address_t **)addr, len);
}

void nsh_worker_release_address(ucp_worker_h w, void *addr)
{
    ucp_worker_release_address(w, (ucp_address_t *)addr);
}

unsigned nsh_worker_progress(ucp_worker_h w)
{
    return ucp_worker_progress(w);
}

int nsh_worker_get_efd(ucp_worker_h w, int *fd)
{
    return ucp_worker_get_efd(w, fd);
}

int nsh_worker_arm(ucp_worker_h w)
{
    return ucp_worker_arm(w);
}

/* ---------------------------------------------------------------- endpoints */

static void nsh_ep_err_cb(void *arg, ucp_ep_h ep, ucs_status_t status)
{
    (void)ep;
    ((nsh_ep_t *)arg)->status = status;
}

int nsh_ep_create(ucp_worker_h w, const void *addr, size_t req_size, uint64_t block_after_ns,
                  nsh_ep_t **out)
{
    ucp_ep_params_t params;
    ucs_status_t status;
    nsh_ep_t *e = calloc(1, sizeof(*e));
    if (e == NULL) {
        return UCS_ERR_NO_MEMORY;
    }
    e->block_after_ns = block_after_ns;
    e->req_size = (req_size + 63) & ~(size_t)63;
    if (posix_memalign(&e->req_mem, 64, e->req_size) != 0) {
        free(e);
        return UCS_ERR_NO_MEMORY;
    }
    memset(&params, 0, sizeof(params));
    params.field_mask      = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS |
                             UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                             UCP_EP_PARAM_FIELD_ERR_HANDLER;
    params.address         = (const ucp_address_t *)addr;
    /* A dead peer must produce an error (via keepalive / transport errors), not a hang. */
    params.err_mode        = UCP_ERR_HANDLING_MODE_PEER;
    params.err_handler.cb  = nsh_ep_err_cb;
    params.err_handler.arg = e;
    status = ucp_ep_create(w, &params, &e->ep);
    if (status != UCS_OK) {
        free(e->req_mem);
        free(e);
        return status;
    }
    *out = e;
    return UCS_OK;
}

int nsh_ep_status(const nsh_ep_t *e)
{
    if (e->ep == NULL && e->status == UCS_OK) {
        return UCS_ERR_NOT_CONNECTED;
    }
    return e->status;
}

/* Close the endpoint, forced if it failed or `force` (outstanding requests then complete with
 * an error), else gracefully (flush, then tell the peer). Progresses for at most timeout_ns; a
 * close request that has not finished by then is abandoned to ucp_worker_destroy. */
static void nsh_ep_close_now(ucp_worker_h w, nsh_ep_t *e, int force, uint64_t timeout_ns)
{
    ucp_request_param_t p;
    void *req;
    uint64_t deadline;

    if (e->ep == NULL) {
        return;
    }
    memset(&p, 0, sizeof(p));
    p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    p.flags        = (force || e->status != UCS_OK) ? UCP_EP_CLOSE_FLAG_FORCE : 0;
    req            = ucp_ep_close_nbx(e->ep, &p);
    if (UCS_PTR_IS_PTR(req)) {
        deadline = nsh_now_ns() + timeout_ns;
        while (ucp_request_check_status(req) == UCS_INPROGRESS && nsh_now_ns() < deadline) {
            ucp_worker_progress(w);
        }
        if (ucp_request_check_status(req) != UCS_INPROGRESS) {
            ucp_request_free(req);
        }
    }
    e->ep = NULL;
    if (e->status == UCS_OK) {
        e->status = UCS_ERR_NOT_CONNECTED;
    }
}

/* Force-close a failed endpoint but keep the handle (its status stays the error). */
void nsh_ep_fail(ucp_worker_h w, nsh_ep_t *e, int status, uint64_t timeout_ns)
{
    if (e->status == UCS_OK) {
        e->status = status;
    }
    nsh_ep_close_now(w, e, 1, timeout_ns);
}

void nsh_ep_destroy(ucp_worker_h w, nsh_ep_t *e, uint64_t timeout_ns)
{
    nsh_ep_close_now(w, e, 0, timeout_ns);
    free(e->req_mem);
    free(e);
}

/* ---------------------------------------------------------------- memory */

/* Map `len` bytes: allocated by UCX if addr == NULL (so shared-memory transports can expose
 * it to peers), otherwise the given memory is registered. Returns the mapped base/length. */
int nsh_mem_map(ucp_context_h ctx, void *addr, size_t len, ucp_mem_h *memh, void **base,
                size_t *mapped_len)
{
    ucp_mem_map_params_t params;
    ucp_mem_attr_t attr;
    ucs_status_t status;

    memset(&params, 0, sizeof(params));
    params.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                        UCP_MEM_MAP_PARAM_FIELD_FLAGS;
    params.address    = addr;
    params.length     = len;
    params.flags      = (addr == NULL) ? UCP_MEM_MAP_ALLOCATE : 0;
    status = ucp_mem_map(ctx, &params, memh);
    if (status != UCS_OK) {
        return status;
    }
    memset(&attr, 0, sizeof(attr));
    attr.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS | UCP_MEM_ATTR_FIELD_LENGTH;
    status = ucp_mem_query(*memh, &attr);
    if (status != UCS_OK) {
        ucp_mem_unmap(ctx, *memh);
        return status;
    }
    *base       = attr.address;
    *mapped_len = attr.length;
    return UCS_OK;
}

int nsh_mem_unmap(ucp_context_h ctx, ucp_mem_h memh)
{
    return ucp_mem_unmap(ctx, memh);
}

int nsh_rkey_pack(ucp_context_h ctx, ucp_mem_h memh, void **buf, size_t *len)
{
    return ucp_rkey_pack(ctx, memh, buf, len);
}

void nsh_rkey_buffer_release(void *buf)
{
    ucp_rkey_buffer_release(buf);
}

int nsh_rkey_unpack(nsh_ep_t *e, const void *buf, ucp_rkey_h *rkey)
{
    if (e->ep == NULL) {
        return UCS_ERR_NOT_CONNECTED;
    }
    return ucp_ep_rkey_unpack(e->ep, buf, rkey);
}

void nsh_rkey_destroy(ucp_rkey_h rkey)
{
    ucp_rkey_destroy(rkey);
}

/* Where the peer's address raddr is mapped in this process (shared-memory transports map the
 * peer's segment when its rkey is unpacked); UCS_ERR_UNREACHABLE when it is not. Valid while
 * the rkey lives. */
int nsh_rkey_ptr(ucp_rkey_h rkey, uint64_t raddr, void **ptr)
{
    return ucp_rkey_ptr(rkey, raddr, ptr);
}

/* ---------------------------------------------------------------- blocking operations */

/* Longest single sleep of a blocked wait: it wakes to check its deadline at least this often. */
#define NSH_BLOCK_MAX_MS 10

/* Sleep on `w`'s event fd until an event arrives (or NSH_BLOCK_MAX_MS pass), unless events are
 * already pending (ucp_worker_arm says busy). Called only after a progress call found nothing. */
static void nsh_block(ucp_worker_h w)
{
    struct pollfd pfd;
    int fd;
    if (ucp_worker_get_efd(w, &fd) != UCS_OK || ucp_worker_arm(w) != UCS_OK) {
        return;
    }
    pfd.fd      = fd;
    pfd.events  = POLLIN;
    pfd.revents = 0;
    (void)poll(&pfd, 1, NSH_BLOCK_MAX_MS);
}

/* Poll `w` until `req` (the result of an nbx call) completes. On deadline or endpoint failure
 * the endpoint is force-closed, which completes the request with an error.
 *
 * When the endpoint has a block_after_ns, a wait that has polled that long without completing
 * sleeps on the worker's event fd instead of polling on. Over tcp a round trip needs the
 * target's progress thread: client threads polling through it take the cores that thread (and
 * the other nodes' clients) need, which on a small machine lengthens every round trip. */
static int nsh_wait(ucp_worker_h w, nsh_ep_t *e, void *req, int user_req, uint64_t timeout_ns)
{
    ucs_status_t status;
    uint64_t deadline, start;
    unsigned spins = 0, progressed;

    if (req == NULL) {
        return UCS_OK;
    }
    if (UCS_PTR_IS_ERR(req)) {
        return UCS_PTR_STATUS(req);
    }
    deadline = 0;
    start    = 0;
    while ((status = ucp_request_check_status(req)) == UCS_INPROGRESS) {
        progressed = ucp_worker_progress(w);
        if ((++spins & 63) == 0) {
            uint64_t now = nsh_now_ns();
            if (deadline == 0) {
                start    = now;
                deadline = now + timeout_ns;
            } else if (now > deadline) {
                /* Force close completes `req` (with an error): it must, since the caller's
                 * buffer is about to be released. */
                nsh_ep_fail(w, e, NSH_TIMED_OUT, timeout_ns);
                deadline = nsh_now_ns() + timeout_ns;
                while ((status = ucp_request_check_status(req)) == UCS_INPROGRESS) {
                    ucp_worker_progress(w);
                    if (nsh_now_ns() > deadline) {
                        fprintf(stderr, "nessie-fabric-ucx: a request survived a forced endpoint "
                                "close; aborting rather than letting UCX write into freed memory\n");
                        abort();
                    }
                }
                if (!user_req) {
                    ucp_request_free(req);
                }
                return NSH_TIMED_OUT;
            } else if (e->block_after_ns != 0 && progressed == 0 &&
                       now - start >= e->block_after_ns) {
                nsh_block(w);
            }
        }
    }
    if (!user_req) {
        ucp_request_free(req);
    }
    return status;
}

static int nsh_check_ep(ucp_worker_h w, nsh_ep_t *e)
{
    /* Let pending events (keepalive, transport errors) reach the error callback first. */
    if (++e->posts_since_progress >= NSH_PROGRESS_EVERY) {
        e->posts_since_progress = 0;
        ucp_worker_progress(w);
    }
    return nsh_ep_status(e);
}

/* What an operation performed straight on a peer's mapped memory checks first, as a posted one
 * does: pending failure events (keepalive) are let through every NSH_PROGRESS_EVERY-th time,
 * and the endpoint's status is returned. */
int nsh_ep_check(ucp_worker_h w, nsh_ep_t *e)
{
    return nsh_check_ep(w, e);
}

int nsh_get(ucp_worker_h w, nsh_ep_t *e, void *buf, size_t len, uint64_t raddr,
            ucp_rkey_h rkey, uint64_t timeout_ns)
{
    ucp_request_param_t p;
    int status = nsh_check_ep(w, e);
    if (status != UCS_OK) {
        return status;
    }
    /* READ and WRITE use UCX's request pool: the zeroed user request (nsh_req_prepare) is only
     * needed by software-emulated atomics, and zeroing it costs a noticeable share of a small
     * shm READ. */
    memset(&p, 0, sizeof(p));
    status = nsh_wait(w, e, ucp_get_nbx(e->ep, buf, len, raddr, rkey, &p), 0, timeout_ns);
    return (status == UCS_OK) ? e->status : status;
}

int nsh_put(ucp_worker_h w, nsh_ep_t *e, const void *buf, size_t len, uint64_t raddr,
            ucp_rkey_h rkey, uint64_t timeout_ns)
{
    ucp_request_param_t p;
    int status = nsh_check_ep(w, e);
    if (status != UCS_OK) {
        return status;
    }
    memset(&p, 0, sizeof(p));
    status = nsh_wait(w, e, ucp_put_nbx(e->ep, buf, len, raddr, rkey, &p), 0, timeout_ns);
    if (status != UCS_OK) {
        return status;
    }
    /* Put completion only means the source buffer is reusable: flush for remote completion. */
    memset(&p, 0, sizeof(p));
    status = nsh_wait(w, e, ucp_ep_flush_nbx(e->ep, &p), 0, timeout_ns);
    return (status == UCS_OK) ? e->status : status;
}

int nsh_cswap64(ucp_worker_h w, nsh_ep_t *e, uint64_t expected, uint64_t desired,
                uint64_t raddr, ucp_rkey_h rkey, uint64_t timeout_ns, uint64_t *old)
{
    ucp_request_param_t p;
    uint64_t compare = expected;
    uint64_t result  = desired; /* in: value to swap in; out: value found at raddr */
    int status       = nsh_check_ep(w, e);
    if (status != UCS_OK) {
        return status;
    }
    memset(&p, 0, sizeof(p));
    p.op_attr_mask = UCP_OP_ATTR_FIELD_DATATYPE | UCP_OP_ATTR_FIELD_REPLY_BUFFER;
    p.datatype     = ucp_dt_make_contig(8);
    p.reply_buffer = &result;
    nsh_req_prepare(e, &p);
    status = nsh_wait(w, e,
                      ucp_atomic_op_nbx(e->ep, UCP_ATOMIC_OP_CSWAP, &compare, 1, raddr, rkey, &p),
                      1, timeout_ns);
    if (status == UCS_OK) {
        *old = result;
        return e->status;
    }
    return status;
}

/* ucp_ep_print_info into buf (NUL-terminated, truncated to len). */
void nsh_ep_info(const nsh_ep_t *e, char *buf, size_t len)
{
    FILE *f;
    if (len == 0) {
        return;
    }
    buf[0] = '\0';
    if (e->ep == NULL || (f = fmemopen(buf, len, "w")) == NULL) {
        return;
    }
    ucp_ep_print_info(e->ep, f);
    fclose(f);
    buf[len - 1] = '\0';
}

/* Flush the endpoint (waits for wireup with the peer to finish and all prior operations to
 * complete remotely). */
int nsh_ep_flush(ucp_worker_h w, nsh_ep_t *e, uint64_t timeout_ns)
{
    ucp_request_param_t p;
    int status = nsh_check_ep(w, e);
    if (status != UCS_OK) {
        return status;
    }
    memset(&p, 0, sizeof(p));
    status = nsh_wait(w, e, ucp_ep_flush_nbx(e->ep, &p), 0, timeout_ns);
    return (status == UCS_OK) ? e->status : status;
}

/* ---------------------------------------------------------------- batches */

/* Most operations one nsh_batch call takes (the Rust side's MAX_BATCH_OPS is at most this). */
#define NSH_BATCH_MAX 64

enum { NSH_OP_READ = 0, NSH_OP_WRITE = 1, NSH_OP_CAS = 2 };

/* One operation of a batch; the layout is mirrored by `ffi::NshBatchOp`. */
typedef struct nsh_batch_op {
    nsh_ep_t *ep;
    ucp_rkey_h rkey;
    uint64_t raddr;
    void *buf;          /* READ: destination; WRITE: source; CAS: unused */
    size_t len;
    uint64_t expected;  /* CAS */
    uint64_t result;    /* CAS in: the value to swap in; out: the value found */
    int kind;           /* NSH_OP_* */
    int status;         /* out */
} nsh_batch_op_t;

/* A request in flight: an operation's or a flush's. */
typedef struct nsh_pending {
    void *req;          /* NULL once complete */
    void *user_mem;     /* user request memory to free (CAS), or NULL: UCX's pool */
    nsh_ep_t *ep;
    int status;
} nsh_pending_t;

/* Record a posted request's immediate outcome. */
static void nsh_pending_set(nsh_pending_t *q, nsh_ep_t *e, void *req, void *user_mem)
{
    q->ep       = e;
    q->user_mem = user_mem;
    q->req      = NULL;
    if (req == NULL) {
        q->status = UCS_OK;
    } else if (UCS_PTR_IS_ERR(req)) {
        q->status = UCS_PTR_STATUS(req);
    } else {
        q->req    = req;
        q->status = UCS_INPROGRESS;
    }
}

static void nsh_pending_release(nsh_pending_t *q)
{
    if (q->user_mem != NULL) {
        free(q->user_mem);
        q->user_mem = NULL;
    } else if (q->req != NULL) {
        ucp_request_free(q->req);
    }
    q->req = NULL;
}

/* Poll `w` until every request of `q` completes: one progress loop for all of them, as
 * nsh_wait does for one (deadline, blocking after block_after_ns). On the deadline the
 * endpoints of the requests still in flight are force-closed, which completes them with an
 * error (their buffers are the caller's, about to be released). */
static void nsh_wait_all(ucp_worker_h w, nsh_pending_t *q, size_t n, uint64_t block_after_ns,
                         uint64_t timeout_ns)
{
    uint64_t deadline = 0, start = 0;
    unsigned spins = 0, progressed;
    size_t i, pending = 0;
    int timed_out = 0;

    for (i = 0; i < n; i++) {
        pending += (q[i].req != NULL);
    }
    while (pending > 0) {
        progressed = ucp_worker_progress(w);
        for (i = 0; i < n; i++) {
            ucs_status_t st;
            if (q[i].req == NULL) {
                continue;
            }
            st = ucp_request_check_status(q[i].req);
            if (st == UCS_INPROGRESS) {
                continue;
            }
            q[i].status = timed_out ? NSH_TIMED_OUT : st;
            nsh_pending_release(&q[i]);
            pending--;
        }
        if (pending == 0 || (++spins & 63) != 0) {
            continue;
        }
        {
            uint64_t now = nsh_now_ns();
            if (deadline == 0) {
                start    = now;
                deadline = now + timeout_ns;
            } else if (now > deadline && !timed_out) {
                timed_out = 1;
                for (i = 0; i < n; i++) {
                    if (q[i].req != NULL) {
                        nsh_ep_fail(w, q[i].ep, NSH_TIMED_OUT, timeout_ns);
                    }
                }
                deadline = nsh_now_ns() + timeout_ns;
            } else if (now > deadline) {
                fprintf(stderr, "nessie-fabric-ucx: a request survived a forced endpoint "
                        "close; aborting rather than letting UCX write into freed memory\n");
                abort();
            } else if (block_after_ns != 0 && progressed == 0 && !timed_out &&
                       now - start >= block_after_ns) {
                nsh_block(w);
            }
        }
    }
}

/* Post every operation of `ops` (ucp_get_nbx / ucp_put_nbx / ucp_atomic_op_nbx), then
 * progress the worker until all complete; then flush, once per endpoint, the endpoints that
 * took a WRITE (put completion is local only). Each operation gets its own status. The caller
 * guarantees that no two operations conflict (overlapping bytes, one of them a change): they
 * may take effect in any order. Returns UCS_ERR_INVALID_PARAM (touching nothing) when n
 * exceeds NSH_BATCH_MAX. */
int nsh_batch(ucp_worker_h w, nsh_batch_op_t *ops, size_t n, uint64_t timeout_ns)
{
    nsh_pending_t q[NSH_BATCH_MAX];
    nsh_pending_t flush[NSH_BATCH_MAX];
    nsh_ep_t *flushed[NSH_BATCH_MAX];
    size_t i, j, nflush = 0;
    uint64_t block_after_ns = 0;

    if (n > NSH_BATCH_MAX) {
        return UCS_ERR_INVALID_PARAM;
    }
    for (i = 0; i < n; i++) {
        nsh_batch_op_t *op = &ops[i];
        ucp_request_param_t p;
        void *req, *mem = NULL;
        int status = nsh_check_ep(w, op->ep);
        q[i].req      = NULL;
        q[i].user_mem = NULL;
        q[i].ep       = op->ep;
        if (status != UCS_OK) {
            q[i].status = status;
            continue;
        }
        block_after_ns = op->ep->block_after_ns;
        memset(&p, 0, sizeof(p));
        switch (op->kind) {
        case NSH_OP_READ:
            req = ucp_get_nbx(op->ep->ep, op->buf, op->len, op->raddr, op->rkey, &p);
            break;
        case NSH_OP_WRITE:
            req = ucp_put_nbx(op->ep->ep, op->buf, op->len, op->raddr, op->rkey, &p);
            break;
        case NSH_OP_CAS:
            /* Zeroed user request memory, as nsh_req_prepare gives a single CAS (one per
             * operation: several may be in flight on one endpoint). */
            if (posix_memalign(&mem, 64, op->ep->req_size) != 0) {
                q[i].status = UCS_ERR_NO_MEMORY;
                continue;
            }
            memset(mem, 0, op->ep->req_size);
            p.op_attr_mask = UCP_OP_ATTR_FIELD_DATATYPE | UCP_OP_ATTR_FIELD_REPLY_BUFFER |
                             UCP_OP_ATTR_FIELD_REQUEST;
            p.datatype     = ucp_dt_make_contig(8);
            p.reply_buffer = &op->result;
            p.request      = (char *)mem + op->ep->req_size;
            req = ucp_atomic_op_nbx(op->ep->ep, UCP_ATOMIC_OP_CSWAP, &op->expected, 1,
                                    op->raddr, op->rkey, &p);
            break;
        default:
            req = UCS_STATUS_PTR(UCS_ERR_INVALID_PARAM);
            break;
        }
        nsh_pending_set(&q[i], op->ep, req, mem);
        if (q[i].req == NULL && mem != NULL) {
            free(mem);
            q[i].user_mem = NULL;
        }
    }
    nsh_wait_all(w, q, n, block_after_ns, timeout_ns);
    for (i = 0; i < n; i++) {
        /* A request that completed on an endpoint that failed meanwhile is not trusted. */
        ops[i].status = (q[i].status == UCS_OK) ? ops[i].ep->status : q[i].status;
        if (ops[i].status != UCS_OK || ops[i].kind != NSH_OP_WRITE) {
            continue;
        }
        for (j = 0; j < nflush && flushed[j] != ops[i].ep; j++) {
        }
        if (j == nflush) {
            ucp_request_param_t p;
            memset(&p, 0, sizeof(p));
            flushed[nflush] = ops[i].ep;
            nsh_pending_set(&flush[nflush], ops[i].ep, ucp_ep_flush_nbx(ops[i].ep->ep, &p),
                            NULL);
            nflush++;
        }
    }
    if (nflush == 0) {
        return UCS_OK;
    }
    nsh_wait_all(w, flush, nflush, block_after_ns, timeout_ns);
    for (i = 0; i < n; i++) {
        if (ops[i].status != UCS_OK || ops[i].kind != NSH_OP_WRITE) {
            continue;
        }
        for (j = 0; flushed[j] != ops[i].ep; j++) {
        }
        ops[i].status = (flush[j].status == UCS_OK) ? ops[i].ep->status : flush[j].status;
    }
    return UCS_OK;
}

/* ---------------------------------------------------------------- posted operations */

/* One operation posted without waiting (`Post::post` on the Rust side, which mirrors the
 * layout): the operation, the request in flight (the operation's own, then for a WRITE the
 * flush that makes it remotely complete), and which of the two that is. The caller keeps it at
 * one address and its buffer untouched until nsh_posted_test returns a final status. */
typedef struct nsh_posted {
    nsh_batch_op_t op;
    nsh_pending_t q;
    int flushing;
} nsh_posted_t;

/* Post p->op's request: ucp_get_nbx / ucp_put_nbx / ucp_atomic_op_nbx (a CAS with its own
 * zeroed request memory, as in nsh_batch). */
static void nsh_post_op(ucp_worker_h w, nsh_posted_t *p)
{
    nsh_batch_op_t *op = &p->op;
    ucp_request_param_t prm;
    void *req, *mem = NULL;
    int status = nsh_check_ep(w, op->ep);

    p->q.req      = NULL;
    p->q.user_mem = NULL;
    p->q.ep       = op->ep;
    if (status != UCS_OK) {
        p->q.status = status;
        return;
    }
    memset(&prm, 0, sizeof(prm));
    switch (op->kind) {
    case NSH_OP_READ:
        req = ucp_get_nbx(op->ep->ep, op->buf, op->len, op->raddr, op->rkey, &prm);
        break;
    case NSH_OP_WRITE:
        req = ucp_put_nbx(op->ep->ep, op->buf, op->len, op->raddr, op->rkey, &prm);
        break;
    case NSH_OP_CAS:
        if (posix_memalign(&mem, 64, op->ep->req_size) != 0) {
            p->q.status = UCS_ERR_NO_MEMORY;
            return;
        }
        memset(mem, 0, op->ep->req_size);
        prm.op_attr_mask = UCP_OP_ATTR_FIELD_DATATYPE | UCP_OP_ATTR_FIELD_REPLY_BUFFER |
                           UCP_OP_ATTR_FIELD_REQUEST;
        prm.datatype     = ucp_dt_make_contig(8);
        prm.reply_buffer = &op->result;
        prm.request      = (char *)mem + op->ep->req_size;
        req = ucp_atomic_op_nbx(op->ep->ep, UCP_ATOMIC_OP_CSWAP, &op->expected, 1, op->raddr,
                                op->rkey, &prm);
        break;
    default:
        req = UCS_STATUS_PTR(UCS_ERR_INVALID_PARAM);
        break;
    }
    nsh_pending_set(&p->q, op->ep, req, mem);
    if (p->q.req == NULL && mem != NULL) {
        free(mem);
        p->q.user_mem = NULL;
    }
}

/* Go on from a request that completed with `status`: a WRITE's put is followed by its flush;
 * otherwise the operation is over. Returns UCS_INPROGRESS while a request is in flight. */
static int nsh_posted_next(nsh_posted_t *p, int status)
{
    for (;;) {
        if (status == UCS_INPROGRESS) {
            return UCS_INPROGRESS;
        }
        /* A request that completed on an endpoint that failed meanwhile is not trusted. */
        if (status == UCS_OK) {
            status = p->op.ep->status;
        }
        if (status != UCS_OK || p->op.kind != NSH_OP_WRITE || p->flushing) {
            p->op.status = status;
            return status;
        }
        {
            ucp_request_param_t prm;
            memset(&prm, 0, sizeof(prm));
            p->flushing = 1;
            nsh_pending_set(&p->q, p->op.ep, ucp_ep_flush_nbx(p->op.ep->ep, &prm), NULL);
            status = p->q.status;
        }
    }
}

/* Post p->op. Returns UCS_INPROGRESS if it is in flight (then nsh_posted_test until it returns
 * something else), or its final status (also in p->op.status). */
int nsh_post(ucp_worker_h w, nsh_posted_t *p)
{
    p->flushing = 0;
    nsh_post_op(w, p);
    return nsh_posted_next(p, p->q.status);
}

/* Whether p's request completed (no progress is made here: call nsh_worker_progress first).
 * Returns UCS_INPROGRESS, or the operation's final status (its request released). */
int nsh_posted_test(nsh_posted_t *p)
{
    ucs_status_t st;
    if (p->q.req == NULL) {
        return nsh_posted_next(p, p->q.status);
    }
    st = ucp_request_check_status(p->q.req);
    if (st == UCS_INPROGRESS) {
        return UCS_INPROGRESS;
    }
    nsh_pending_release(&p->q);
    p->q.status = st;
    return nsh_posted_next(p, st);
}
