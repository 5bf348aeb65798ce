/*
 * kvcs-wanem: a UDP forwarder that makes a loopback path look like a long-haul link.
 *
 *     kvcs-wanem --target 127.0.0.1:4443 [--listen 127.0.0.1:0] [--seed N]
 *                [--delay-ms D] [--loss P] [--rate BYTES_PER_S] [--queue-bytes B]
 *                [--reorder P] [--reorder-ms D] [--no-gro] [--exit-on-stdin-eof]
 *
 * Every link option applies to both directions; --up-X or --down-X to one ("up" is
 * client -> target, "down" is target -> client). Each client address gets its own upstream
 * socket connected to the target (the target sees one address per client, as without the
 * forwarder). Each direction is one link with its own settings, counters and random
 * generator (splitmix64 seeded from --seed and the direction):
 *
 *     in -> loss -> bottleneck (rate, drop-tail queue) -> one-way delay (+ reorder) -> out
 *
 * A datagram's departure time is computed when it arrives: the bottleneck is busy until
 * `free`, a datagram leaves it at max(now, free) + size / rate (dropped if the bytes
 * waiting would exceed --queue-bytes), and is due at the far end a delay later. Due
 * datagrams wait in one time-ordered queue per direction (a binary heap keyed by due time
 * and arrival number): equal delays keep arrival order, so nothing is reordered unless
 * --reorder gives a share of the datagrams --reorder-ms more delay. Nothing is ever sent
 * before it is due.
 *
 * Throughput: one thread, epoll, recvmmsg/sendmmsg in batches of 64, and UDP GRO/GSO where
 * the kernel offers them: a run of equal-size datagrams (what QUIC endpoints send with GSO)
 * arrives as one buffer with its segment size and leaves as one sendmmsg entry with
 * UDP_SEGMENT, so the cost is per run, not per datagram. Loss still applies per datagram
 * (a lost segment is cut out of the run). With --rate set GRO is off (each datagram is
 * timed through the bottleneck on its own).
 *
 * Output: "listening HOST PORT" once bound; on SIGTERM/SIGINT (or the end of standard input
 * with --exit-on-stdin-eof) one JSON line of counters per direction, then exit 0. What is
 * still queued at exit is counted in "pending" and not sent. Datagram counts are of
 * datagrams (segments), not of GRO runs.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/udp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#ifndef UDP_SEGMENT
#define UDP_SEGMENT 103
#endif
#ifndef UDP_GRO
#define UDP_GRO 104
#endif

#define BATCH 64                 /* datagrams (or GRO runs) per recvmmsg/sendmmsg */
#define RECV_ROUNDS 4            /* recvmmsg calls per readiness event, then flush */
#define BUF_SIZE 65536           /* one receive buffer: any UDP datagram or GRO run */
#define MAX_CLIENTS 256
#define SOCKET_BUFFER (4 << 20)  /* SO_RCVBUF/SO_SNDBUF: net.core.[rw]mem_max here */

enum { TAG_SIGNAL = 1, TAG_STDIN, TAG_LISTENER, TAG_UPSTREAM };
#define TAG(kind, index) (((uint64_t)(kind) << 32) | (uint32_t)(index))

struct settings {
    double delay_ms, loss, rate, reorder, reorder_ms;
    uint64_t queue_bytes;
};

struct counters {
    uint64_t datagrams_in, bytes_in, lost, overflowed, reordered, datagrams_out, bytes_out,
        send_errors;
};

struct entry {
    uint64_t due, seq;
    uint8_t *data;
    uint32_t len;
    uint16_t segment; /* GSO segment size; 0: one datagram */
    int16_t client;   /* down: the client to send to */
    int fd;
};

struct link {
    const char *name;
    struct settings s;
    struct counters c;
    uint64_t rng, seq, free_at, held_bytes;
    struct entry *heap;
    size_t n, cap;
    int blocked_fd; /* a socket whose buffer is full: wait for EPOLLOUT */
};

struct client {
    struct sockaddr_storage addr;
    socklen_t addrlen;
    int fd;
};

static struct link up = {.name = "up", .blocked_fd = -1};
static struct link down = {.name = "down", .blocked_fd = -1};
static struct client clients[MAX_CLIENTS];
static int nclients, listener = -1, epfd = -1, gro = 1;
static uint64_t max_held = 1ull << 30; /* bytes held per direction before overflow drops */
static struct sockaddr_storage target;
static socklen_t targetlen;

static uint8_t *bufs[BATCH];
static struct mmsghdr rmsgs[BATCH], smsgs[BATCH];
static struct iovec riov[BATCH], siov[BATCH];
static struct sockaddr_storage raddrs[BATCH];
static char rcmsg[BATCH][CMSG_SPACE(sizeof(int))];
static char scmsg[BATCH][CMSG_SPACE(sizeof(uint16_t))];

static void die(const char *what) {
    fprintf(stderr, "kvcs-wanem: %s: %s\n", what, strerror(errno));
    exit(1);
}

static void usage(const char *why) {
    fprintf(stderr, "kvcs-wanem: %s (see the comment at the top of tools/wanem.c)\n", why);
    exit(2);
}

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static double uniform(struct link *l) { /* splitmix64 -> [0, 1) */
    uint64_t z = (l->rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (double)(z >> 11) * 0x1.0p-53;
}

/* -- the time-ordered queue ------------------------------------------------------------ */

static int before(const struct entry *a, const struct entry *b) {
    return a->due < b->due || (a->due == b->due && a->seq < b->seq);
}

static void heap_push(struct link *l, struct entry e) {
    if (l->n == l->cap) {
        l->cap = l->cap ? l->cap * 2 : 4096;
        l->heap = realloc(l->heap, l->cap * sizeof *l->heap);
        if (!l->heap) die("realloc");
    }
    size_t i = l->n++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (!before(&e, &l->heap[parent])) break;
        l->heap[i] = l->heap[parent];
        i = parent;
    }
    l->heap[i] = e;
}

static struct entry heap_pop(struct link *l) {
    struct entry top = l->heap[0], last = l->heap[--l->n];
    size_t i = 0;
    for (;;) {
        size_t child = 2 * i + 1;
        if (child >= l->n) break;
        if (child + 1 < l->n && before(&l->heap[child + 1], &l->heap[child])) child++;
        if (!before(&l->heap[child], &last)) break;
        l->heap[i] = l->heap[child];
        i = child;
    }
    if (l->n) l->heap[i] = last;
    return top;
}

/* -- the link ---------------------------------------------------------------------------- */

/* One datagram (segment == 0) or GRO run arrives: impair it and queue what survives. */
static void link_push(struct link *l, const uint8_t *data, uint32_t len, uint16_t segment,
                      int fd, int client, uint64_t now) {
    uint32_t count = segment && len > segment ? (len + segment - 1) / segment : 1;
    uint32_t step = count > 1 ? segment : len;
    l->c.datagrams_in += count;
    l->c.bytes_in += len;
    uint8_t *copy = malloc(len ? len : 1);
    if (!copy) die("malloc");
    uint32_t kept = 0, kept_count = 0;
    if (!l->s.loss && !l->s.rate) {
        memcpy(copy, data, len);
        kept = len;
        kept_count = count;
    } else {
        for (uint32_t k = 0; k < count; k++) {
            uint32_t off = k * step, size = len - off < step ? len - off : step;
            if (l->s.loss && uniform(l) < l->s.loss) {
                l->c.lost++;
                continue;
            }
            if (l->s.rate) {
                uint64_t start = l->free_at > now ? l->free_at : now;
                double waiting = (double)(start - now) * l->s.rate / 1e9;
                if (waiting + size > (double)l->s.queue_bytes) {
                    l->c.overflowed++;
                    continue;
                }
                l->free_at = start + (uint64_t)(size * 1e9 / l->s.rate);
            }
            memcpy(copy + kept, data + off, size);
            kept += size;
            kept_count++;
        }
    }
    if (!kept_count) {
        free(copy);
        return;
    }
    if (l->held_bytes + kept > max_held) {
        l->c.overflowed += kept_count;
        free(copy);
        return;
    }
    uint64_t due = (l->s.rate ? l->free_at : now) + (uint64_t)(l->s.delay_ms * 1e6);
    if (l->s.reorder && uniform(l) < l->s.reorder) {
        due += (uint64_t)(l->s.reorder_ms * 1e6);
        l->c.reordered += kept_count;
    }
    struct entry e = {.due = due, .seq = l->seq++, .data = copy, .len = kept,
                      .segment = kept_count > 1 ? segment : 0, .client = (int16_t)client,
                      .fd = fd};
    l->held_bytes += kept;
    heap_push(l, e);
}

static uint64_t datagrams(const struct entry *e) {
    return e->segment ? (e->len + e->segment - 1) / e->segment : 1;
}

static void watch_writable(int fd, uint64_t tag, int on) {
    struct epoll_event ev = {.events = EPOLLIN | (on ? EPOLLOUT : 0), .data.u64 = tag};
    if (epoll_ctl(epfd, EPOLL_CTL_MOD, fd, &ev) < 0) die("epoll_ctl");
}

static uint64_t fd_tag(int fd) {
    if (fd == listener) return TAG(TAG_LISTENER, 0);
    for (int i = 0; i < nclients; i++)
        if (clients[i].fd == fd) return TAG(TAG_UPSTREAM, i);
    return 0;
}

static void sent(struct link *l, struct entry *e) {
    l->c.datagrams_out += datagrams(e);
    l->c.bytes_out += e->len;
    l->held_bytes -= e->len;
    free(e->data);
}

/* Send every due datagram of a link, a sendmmsg per run of entries to the same socket. */
static void link_flush(struct link *l, uint64_t now) {
    struct entry batch[BATCH];
    while (l->blocked_fd < 0 && l->n && l->heap[0].due <= now) {
        int fd = l->heap[0].fd, n = 0;
        while (n < BATCH && l->n && l->heap[0].due <= now && l->heap[0].fd == fd)
            batch[n++] = heap_pop(l);
        for (int i = 0; i < n; i++) {
            struct msghdr *h = &smsgs[i].msg_hdr;
            memset(h, 0, sizeof *h);
            siov[i].iov_base = batch[i].data;
            siov[i].iov_len = batch[i].len;
            h->msg_iov = &siov[i];
            h->msg_iovlen = 1;
            if (fd == listener) {
                h->msg_name = &clients[batch[i].client].addr;
                h->msg_namelen = clients[batch[i].client].addrlen;
            }
            if (batch[i].segment) {
                h->msg_control = scmsg[i];
                h->msg_controllen = sizeof scmsg[i];
                struct cmsghdr *cm = CMSG_FIRSTHDR(h);
                cm->cmsg_level = SOL_UDP;
                cm->cmsg_type = UDP_SEGMENT;
                cm->cmsg_len = CMSG_LEN(sizeof(uint16_t));
                memcpy(CMSG_DATA(cm), &batch[i].segment, sizeof(uint16_t));
            }
        }
        int done = 0;
        while (done < n) {
            int r = sendmmsg(fd, &smsgs[done], (unsigned)(n - done), 0);
            if (r > 0) {
                for (int i = done; i < done + r; i++) sent(l, &batch[i]);
                done += r;
            } else if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
                for (int i = done; i < n; i++) heap_push(l, batch[i]); /* same keys: same order */
                l->blocked_fd = fd;
                watch_writable(fd, fd_tag(fd), 1);
                return;
            } else if (r < 0 && errno == EINTR) {
                continue;
            } else { /* this datagram cannot be sent (target gone, too large): drop it */
                l->c.send_errors += datagrams(&batch[done]);
                l->held_bytes -= batch[done].len;
                free(batch[done].data);
                done++;
            }
        }
    }
}

/* -- sockets ----------------------------------------------------------------------------- */

static void resolve(const char *spec, struct sockaddr_storage *out, socklen_t *outlen) {
    char host[256];
    const char *colon = strrchr(spec, ':');
    if (!colon || (size_t)(colon - spec) >= sizeof host) usage("addresses are HOST:PORT");
    memcpy(host, spec, (size_t)(colon - spec));
    host[colon - spec] = 0;
    char *h = host;
    if (h[0] == '[') { /* [v6]:port */
        h++;
        h[strlen(h) - 1] = 0;
    }
    struct addrinfo hints = {.ai_socktype = SOCK_DGRAM, .ai_flags = AI_NUMERICSERV}, *res;
    if (getaddrinfo(h, colon + 1, &hints, &res) != 0) usage("cannot resolve an address");
    memcpy(out, res->ai_addr, res->ai_addrlen);
    *outlen = res->ai_addrlen;
    freeaddrinfo(res);
}

static int udp_socket(int family) {
    int fd = socket(family, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) die("socket");
    int size = SOCKET_BUFFER, one = 1;
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &size, sizeof size);
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &size, sizeof size);
    if (gro) setsockopt(fd, SOL_UDP, UDP_GRO, &one, sizeof one); /* refused: no GRO */
    return fd;
}

static void watch(int fd, uint64_t tag) {
    struct epoll_event ev = {.events = EPOLLIN, .data.u64 = tag};
    if (epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &ev) < 0) die("epoll_ctl");
}

static int client_for(const struct sockaddr_storage *addr, socklen_t len) {
    static int last = -1;
    if (last >= 0 && clients[last].addrlen == len && !memcmp(&clients[last].addr, addr, len))
        return last;
    for (int i = 0; i < nclients; i++)
        if (clients[i].addrlen == len && !memcmp(&clients[i].addr, addr, len)) return last = i;
    if (nclients == MAX_CLIENTS) return -1; /* further clients are ignored */
    int fd = udp_socket(target.ss_family);
    if (connect(fd, (struct sockaddr *)&target, targetlen) < 0) {
        close(fd);
        return -1;
    }
    struct client *c = &clients[nclients];
    memcpy(&c->addr, addr, len);
    c->addrlen = len;
    c->fd = fd;
    watch(fd, TAG(TAG_UPSTREAM, nclients));
    return last = nclients++;
}

/* Read what a socket holds (a few batches) into a link. */
static void receive(int fd, int from_client, int client) {
    for (int round = 0; round < RECV_ROUNDS; round++) {
        for (int i = 0; i < BATCH; i++) {
            struct msghdr *h = &rmsgs[i].msg_hdr;
            riov[i].iov_base = bufs[i];
            riov[i].iov_len = BUF_SIZE;
            h->msg_iov = &riov[i];
            h->msg_iovlen = 1;
            h->msg_name = from_client ? &raddrs[i] : NULL;
            h->msg_namelen = from_client ? sizeof raddrs[i] : 0;
            h->msg_control = rcmsg[i];
            h->msg_controllen = sizeof rcmsg[i];
            h->msg_flags = 0;
        }
        int r = recvmmsg(fd, rmsgs, BATCH, MSG_DONTWAIT, NULL);
        if (r <= 0) return; /* EAGAIN, or an ICMP error of an earlier send: nothing to read */
        uint64_t now = now_ns();
        for (int i = 0; i < r; i++) {
            struct msghdr *h = &rmsgs[i].msg_hdr;
            uint16_t segment = 0;
            for (struct cmsghdr *cm = CMSG_FIRSTHDR(h); cm; cm = CMSG_NXTHDR(h, cm)) {
                if (cm->cmsg_level == SOL_UDP && cm->cmsg_type == UDP_GRO) {
                    int size;
                    memcpy(&size, CMSG_DATA(cm), sizeof size);
                    if ((uint32_t)size < rmsgs[i].msg_len) segment = (uint16_t)size;
                }
            }
            if (from_client) {
                int c = client_for(&raddrs[i], h->msg_namelen);
                if (c >= 0)
                    link_push(&up, bufs[i], rmsgs[i].msg_len, segment, clients[c].fd, c, now);
            } else {
                link_push(&down, bufs[i], rmsgs[i].msg_len, segment, listener, client, now);
            }
        }
        if (r < BATCH) return;
    }
}

/* -- options and main -------------------------------------------------------------------- */

static double number(const char *name, const char *value, double lo, double hi) {
    char *end;
    double v = strtod(value, &end);
    if (*value == 0 || *end != 0 || !(v >= lo && v <= hi)) {
        fprintf(stderr, "kvcs-wanem: --%s must be a number in [%g, %g], got %s\n", name, lo, hi,
                value);
        exit(2);
    }
    return v;
}

static int link_option(struct settings *s, const char *name, const char *value) {
    if (!strcmp(name, "delay-ms")) s->delay_ms = number(name, value, 0, 1e6);
    else if (!strcmp(name, "loss")) s->loss = number(name, value, 0, 1);
    else if (!strcmp(name, "rate")) s->rate = number(name, value, 0, 1e12);
    else if (!strcmp(name, "queue-bytes")) s->queue_bytes = (uint64_t)number(name, value, 0, 1e12);
    else if (!strcmp(name, "reorder")) s->reorder = number(name, value, 0, 1);
    else if (!strcmp(name, "reorder-ms")) s->reorder_ms = number(name, value, 0, 1e6);
    else return 0;
    return 1;
}

static void print_link(const struct link *l, int last) {
    const struct counters *c = &l->c;
    uint64_t pending = 0;
    for (size_t i = 0; i < l->n; i++) pending += datagrams(&l->heap[i]);
    printf("\"%s\": {\"datagrams_in\": %llu, \"bytes_in\": %llu, \"lost\": %llu, "
           "\"overflowed\": %llu, \"reordered\": %llu, \"datagrams_out\": %llu, "
           "\"bytes_out\": %llu, \"send_errors\": %llu, \"pending\": %llu}%s",
           l->name, (unsigned long long)c->datagrams_in, (unsigned long long)c->bytes_in,
           (unsigned long long)c->lost, (unsigned long long)c->overflowed,
           (unsigned long long)c->reordered, (unsigned long long)c->datagrams_out,
           (unsigned long long)c->bytes_out, (unsigned long long)c->send_errors,
           (unsigned long long)pending, last ? "" : ", ");
}

int main(int argc, char **argv) {
    const char *listen_spec = "127.0.0.1:0", *target_spec = NULL;
    uint64_t seed = 1;
    int stdin_eof = 0;
    up.s.queue_bytes = down.s.queue_bytes = 1 << 20;
    up.s.reorder_ms = down.s.reorder_ms = 1.0;
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        if (strncmp(arg, "--", 2)) usage("options are --name value");
        const char *name = arg + 2;
        if (!strcmp(name, "no-gro")) { gro = 0; continue; }
        if (!strcmp(name, "exit-on-stdin-eof")) { stdin_eof = 1; continue; }
        if (i + 1 >= argc) usage("an option lacks its value");
        const char *value = argv[++i];
        if (!strcmp(name, "listen")) listen_spec = value;
        else if (!strcmp(name, "target")) target_spec = value;
        else if (!strcmp(name, "seed")) seed = strtoull(value, NULL, 10);
        else if (!strcmp(name, "max-held-bytes")) max_held = (uint64_t)number(name, value, 1, 1e15);
        else if (!strncmp(name, "up-", 3)) {
            if (!link_option(&up.s, name + 3, value)) usage("unknown option");
        } else if (!strncmp(name, "down-", 5)) {
            if (!link_option(&down.s, name + 5, value)) usage("unknown option");
        } else if (!link_option(&up.s, name, value) || !link_option(&down.s, name, value)) {
            usage("unknown option");
        }
    }
    if (!target_spec) usage("--target HOST:PORT is required");
    if (up.s.rate || down.s.rate) gro = 0; /* the bottleneck times each datagram */
    up.rng = seed * 2 + 0x243f6a8885a308d3ull;
    down.rng = seed * 2 + 1 + 0x13198a2e03707344ull;
    resolve(target_spec, &target, &targetlen);
    struct sockaddr_storage laddr;
    socklen_t laddrlen;
    resolve(listen_spec, &laddr, &laddrlen);

    for (int i = 0; i < BATCH; i++)
        if (!(bufs[i] = malloc(BUF_SIZE))) die("malloc");
    epfd = epoll_create1(EPOLL_CLOEXEC);
    if (epfd < 0) die("epoll_create1");
    sigset_t mask;
    sigemptyset(&mask);
    sigaddset(&mask, SIGTERM);
    sigaddset(&mask, SIGINT);
    sigprocmask(SIG_BLOCK, &mask, NULL);
    int sfd = signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);
    if (sfd < 0) die("signalfd");
    watch(sfd, TAG(TAG_SIGNAL, 0));
    if (stdin_eof) watch(0, TAG(TAG_STDIN, 0));
    listener = udp_socket(laddr.ss_family);
    if (bind(listener, (struct sockaddr *)&laddr, laddrlen) < 0) die("bind");
    watch(listener, TAG(TAG_LISTENER, 0));
    struct sockaddr_storage bound;
    socklen_t boundlen = sizeof bound;
    getsockname(listener, (struct sockaddr *)&bound, &boundlen);
    char host[INET6_ADDRSTRLEN] = "?";
    int port = 0;
    if (bound.ss_family == AF_INET) {
        struct sockaddr_in *a = (struct sockaddr_in *)&bound;
        inet_ntop(AF_INET, &a->sin_addr, host, sizeof host);
        port = ntohs(a->sin_port);
    } else {
        struct sockaddr_in6 *a = (struct sockaddr_in6 *)&bound;
        inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof host);
        port = ntohs(a->sin6_port);
    }
    printf("listening %s %d\n", host, port);
    fflush(stdout);

    struct epoll_event events[16];
    for (int running = 1; running;) {
        uint64_t now = now_ns(), next = UINT64_MAX;
        if (up.n && up.blocked_fd < 0 && up.heap[0].due < next) next = up.heap[0].due;
        if (down.n && down.blocked_fd < 0 && down.heap[0].due < next) next = down.heap[0].due;
        struct timespec timeout, *t = NULL;
        if (next != UINT64_MAX) {
            uint64_t wait = next > now ? next - now : 0;
            timeout.tv_sec = (time_t)(wait / 1000000000ull);
            timeout.tv_nsec = (long)(wait % 1000000000ull);
            t = &timeout;
        }
        int n = epoll_pwait2(epfd, events, 16, t, NULL);
        if (n < 0 && errno != EINTR) die("epoll_pwait2");
        for (int i = 0; i < n; i++) {
            uint64_t tag = events[i].data.u64;
            uint32_t kind = (uint32_t)(tag >> 32), index = (uint32_t)tag;
            if (kind == TAG_SIGNAL || kind == TAG_STDIN) {
                char buf[256];
                if (kind == TAG_SIGNAL || read(0, buf, sizeof buf) <= 0) running = 0;
                continue;
            }
            int fd = kind == TAG_LISTENER ? listener : clients[index].fd;
            if (events[i].events & EPOLLOUT) {
                watch_writable(fd, tag, 0);
                if (up.blocked_fd == fd) up.blocked_fd = -1;
                if (down.blocked_fd == fd) down.blocked_fd = -1;
            }
            if (events[i].events & (EPOLLIN | EPOLLERR)) {
                if (kind == TAG_LISTENER) receive(fd, 1, -1);
                else receive(fd, 0, (int)index);
            }
        }
        now = now_ns();
        link_flush(&up, now);
        link_flush(&down, now);
    }
    printf("{");
    print_link(&up, 0);
    print_link(&down, 1);
    printf(", \"clients\": %d}\n", nclients);
    fflush(stdout);
    return 0;
}
