/* cloudbox-mpiio: a parallel I/O workload with IOR's parameters and output fields (not IOR): MPI-IO, POSIX, HDF5. */
/*
 * Every rank writes (then reads) `segments` x `block` bytes in `xfer`-byte transfers, to one shared file
 * (IOR's segmented layout: segment s, rank r at s*N*block + r*block) or to a file of its own (-F). Phases are
 * separated by barriers; a phase's bandwidth is all ranks' bytes over the time from the barrier that starts it to
 * the last close, as IOR reports it (each rank times from that barrier's exit, so hosts' clocks need not agree).
 * Reads (-C) take the data of the next rank, so no rank reads back its own page cache.
 * Each transfer starts with its file offset and writer's rank, which reads check. Rank 0 prints one JSON document.
 *
 * Usage: cloudbox-mpiio -o PATH -t XFER -b BLOCK [-s SEGMENTS] [-a mpiio|posix|hdf5] [-F] [-L] [-c] [-e] [-C] [-w] [-r]
 *   -F  file per process: PATH.<rank> (-L: PATH itself, each rank on its own host's PATH, e.g. a disk)
 *   -c  collective transfers (MPI_File_write_at_all / read_at_all, HDF5's collective transfer mode);
 *   -e  fsync before close (HDF5: H5Fflush)
 *   sizes take k, m, g suffixes (powers of 1024); -w and -r select the phases (default both)
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <hdf5.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

struct opts {
    const char *path, *api;
    long long xfer, block, segments;
    int fpp, local, collective, fsync_, shift, do_write, do_read;
};

struct times {
    double t0;                        /* this rank's clock when the phase's barrier let it go */
    double open0, open1, io1, close1; /* from t0 (s): open start, open end, last transfer, close end */
    long long bytes, errors;
};

static int rank, nranks;

static void die(const char *fmt, const char *arg) {
    {
        fprintf(stderr, "cloudbox-mpiio: rank %d: error: ", rank);
        fprintf(stderr, fmt, arg);
        fputc('\n', stderr);
    }
    MPI_Abort(MPI_COMM_WORLD, 2);
    exit(2);
}

static void die_mpi(const char *call, const char *name, int rc) {
    char text[MPI_MAX_ERROR_STRING], msg[MPI_MAX_ERROR_STRING + 4200];
    int len = 0;
    MPI_Error_string(rc, text, &len);
    snprintf(msg, sizeof msg, "%s of %s failed: %s (errno %d: %s)", call, name, text, errno, strerror(errno));
    die("%s", msg);
}

static long long size_arg(const char *s, const char *flag) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || v <= 0) die("%s needs a positive size (e.g. 64k, 1m)", flag);
    switch (*end) {
    case 'k': case 'K': v <<= 10; end++; break;
    case 'm': case 'M': v <<= 20; end++; break;
    case 'g': case 'G': v <<= 30; end++; break;
    }
    if (*end) die("%s: unknown size suffix (allowed: k, m, g)", flag);
    return v;
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static void file_name(const struct opts *o, int owner, char *buf, size_t len) {
    if (o->fpp && !o->local)
        snprintf(buf, len, "%s.%08d", o->path, owner);
    else
        snprintf(buf, len, "%s", o->path);
}

/* Offset of transfer i of segment s of `owner`'s data. */
static long long offset_of(const struct opts *o, int owner, long long s, long long i) {
    long long seg = o->fpp ? o->block : o->block * nranks;
    long long base = o->fpp ? 0 : (long long)owner * o->block;
    return s * seg + base + i * o->xfer;
}

static void stamp(char *buf, long long off, int owner) {
    int64_t v[2] = {off, owner};
    memcpy(buf, v, sizeof v);
}

static int check(const char *buf, long long off, int owner) {
    int64_t v[2];
    memcpy(v, buf, sizeof v);
    return v[0] != off || v[1] != owner;
}

/* One dataset of bytes in the file, laid out as the MPI-IO file is: transfer i of segment s of rank r at the same
 * offset in the dataset. Its creation and the file's open and close are collective, as in IOR's HDF5 interface. */
static void hdf5_phase(const struct opts *o, int writing, int owner, const char *name, char *buf, struct times *t) {
    MPI_Comm comm = o->fpp ? MPI_COMM_SELF : MPI_COMM_WORLD;
    int ranks_in_file = o->fpp ? 1 : nranks;
    hid_t fapl = H5Pcreate(H5P_FILE_ACCESS), dxpl = H5Pcreate(H5P_DATASET_XFER), file, dset;
    H5Pset_fapl_mpio(fapl, comm, MPI_INFO_NULL);
    H5Pset_dxpl_mpio(dxpl, o->collective ? H5FD_MPIO_COLLECTIVE : H5FD_MPIO_INDEPENDENT);
    hsize_t size = (hsize_t)(o->segments * o->block * ranks_in_file), count = (hsize_t)o->xfer;
    if (writing) {
        file = H5Fcreate(name, H5F_ACC_TRUNC, H5P_DEFAULT, fapl);
        if (file < 0) die("H5Fcreate of %s failed", name);
        hid_t space = H5Screate_simple(1, &size, NULL);
        dset = H5Dcreate2(file, "cloudbox", H5T_NATIVE_UCHAR, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
        H5Sclose(space);
    } else {
        file = H5Fopen(name, H5F_ACC_RDONLY, fapl);
        if (file < 0) die("H5Fopen of %s failed", name);
        dset = H5Dopen2(file, "cloudbox", H5P_DEFAULT);
    }
    if (dset < 0) die("the dataset 'cloudbox' in %s cannot be made or opened", name);
    t->open1 = now() - t->t0;
    hid_t fspace = H5Dget_space(dset), mspace = H5Screate_simple(1, &count, NULL);
    long long per = o->block / o->xfer;
    for (long long s = 0; s < o->segments; s++)
        for (long long i = 0; i < per; i++) {
            long long off = offset_of(o, owner, s, i);
            hsize_t start = (hsize_t)off;
            H5Sselect_hyperslab(fspace, H5S_SELECT_SET, &start, NULL, &count, NULL);
            herr_t rc;
            if (writing) {
                stamp(buf, off, owner);
                rc = H5Dwrite(dset, H5T_NATIVE_UCHAR, mspace, fspace, dxpl, buf);
            } else {
                rc = H5Dread(dset, H5T_NATIVE_UCHAR, mspace, fspace, dxpl, buf);
                if (rc >= 0) t->errors += check(buf, off, owner);
            }
            if (rc < 0) die(writing ? "H5Dwrite to %s failed" : "H5Dread from %s failed", name);
            t->bytes += o->xfer;
        }
    if (writing && o->fsync_ && H5Fflush(file, H5F_SCOPE_GLOBAL) < 0) die("H5Fflush of %s failed", name);
    t->io1 = now() - t->t0;
    H5Sclose(mspace);
    H5Sclose(fspace);
    H5Dclose(dset);
    H5Pclose(dxpl);
    H5Pclose(fapl);
    if (H5Fclose(file) < 0) die("H5Fclose of %s failed", name);
}

static void phase(const struct opts *o, int writing, char *buf, struct times *t) {
    int owner = writing ? rank : (rank + o->shift) % nranks;
    char name[4096];
    file_name(o, owner, name, sizeof name);
    long long per = o->block / o->xfer;
    MPI_Barrier(MPI_COMM_WORLD);
    /* Ranks on other hosts read other clocks: every time is taken from the barrier's exit, their common origin. */
    t->t0 = now();
    t->open0 = 0;
    t->bytes = t->errors = 0;
    if (strcmp(o->api, "posix") == 0) {
        int flags = writing ? O_WRONLY | O_CREAT : O_RDONLY;
        int fd = open(name, flags, 0644);
        if (fd < 0) die_mpi("open", name, MPI_SUCCESS);
        t->open1 = now() - t->t0;
        for (long long s = 0; s < o->segments; s++)
            for (long long i = 0; i < per; i++) {
                long long off = offset_of(o, owner, s, i);
                ssize_t n;
                if (writing) {
                    stamp(buf, off, owner);
                    n = pwrite(fd, buf, o->xfer, off);
                } else {
                    n = pread(fd, buf, o->xfer, off);
                    if (n == o->xfer) t->errors += check(buf, off, owner);
                }
                if (n != o->xfer) die(writing ? "short write to %s" : "short read from %s", name);
                t->bytes += n;
            }
        if (writing && o->fsync_ && fsync(fd) != 0) die_mpi("fsync", name, MPI_SUCCESS);
        t->io1 = now() - t->t0;
        if (close(fd) != 0) die_mpi("close", name, MPI_SUCCESS);
    } else if (strcmp(o->api, "hdf5") == 0) {
        hdf5_phase(o, writing, owner, name, buf, t);
    } else {
        MPI_File fh;
        MPI_Comm comm = o->fpp ? MPI_COMM_SELF : MPI_COMM_WORLD;
        int amode = writing ? MPI_MODE_WRONLY | MPI_MODE_CREATE : MPI_MODE_RDONLY;
        int rc_open = MPI_File_open(comm, name, amode, MPI_INFO_NULL, &fh), rc_sync;
        if (rc_open != MPI_SUCCESS) die_mpi("MPI_File_open", name, rc_open);
        t->open1 = now() - t->t0;
        for (long long s = 0; s < o->segments; s++)
            for (long long i = 0; i < per; i++) {
                long long off = offset_of(o, owner, s, i);
                MPI_Status st;
                int rc, got = 0;
                if (writing) {
                    stamp(buf, off, owner);
                    rc = o->collective ? MPI_File_write_at_all(fh, off, buf, (int)o->xfer, MPI_BYTE, &st)
                                       : MPI_File_write_at(fh, off, buf, (int)o->xfer, MPI_BYTE, &st);
                } else {
                    rc = o->collective ? MPI_File_read_at_all(fh, off, buf, (int)o->xfer, MPI_BYTE, &st)
                                       : MPI_File_read_at(fh, off, buf, (int)o->xfer, MPI_BYTE, &st);
                }
                MPI_Get_count(&st, MPI_BYTE, &got);
                if (rc != MPI_SUCCESS || got != o->xfer) die(writing ? "short write to %s" : "short read from %s", name);
                if (!writing) t->errors += check(buf, off, owner);
                t->bytes += got;
            }
        if (writing && o->fsync_ && (rc_sync = MPI_File_sync(fh)) != MPI_SUCCESS) die_mpi("MPI_File_sync", name, rc_sync);
        t->io1 = now() - t->t0;
        if ((rc_sync = MPI_File_close(&fh)) != MPI_SUCCESS) die_mpi("MPI_File_close", name, rc_sync);
    }
    t->close1 = now() - t->t0;
}

static void report(const struct opts *o, const char *access, const struct times *t, const char *hosts, int first) {
    double mine[5] = {t->open0, t->open1, t->io1, t->close1, t->t0};
    long long counts[2] = {t->bytes, t->errors};
    double *all = rank == 0 ? malloc(sizeof mine * nranks) : NULL;
    long long *allc = rank == 0 ? malloc(sizeof counts * nranks) : NULL;
    MPI_Gather(mine, 5, MPI_DOUBLE, all, 5, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    MPI_Gather(counts, 2, MPI_LONG_LONG, allc, 2, MPI_LONG_LONG, 0, MPI_COMM_WORLD);
    if (rank != 0) return;
    double start = all[0], end = all[3], open_s = 0, io_s = 0, close_s = 0;
    long long bytes = 0, errors = 0;
    for (int r = 0; r < nranks; r++) {
        double *a = all + 5 * r;
        if (a[0] < start) start = a[0];
        if (a[3] > end) end = a[3];
        if (a[1] - a[0] > open_s) open_s = a[1] - a[0];
        if (a[2] - a[1] > io_s) io_s = a[2] - a[1];
        if (a[3] - a[2] > close_s) close_s = a[3] - a[2];
        bytes += allc[2 * r];
        errors += allc[2 * r + 1];
    }
    double total = end - start, mib = bytes / 1048576.0;
    long long transfers = bytes / o->xfer;
    printf("%s{\"access\": \"%s\", \"bw_MiBps\": %.3f, \"IOPS\": %.3f, \"latency_s\": %.9f, \"block_KiB\": %lld, "
           "\"xfer_KiB\": %lld, \"open_s\": %.9f, \"wrrd_s\": %.9f, \"close_s\": %.9f, \"total_s\": %.9f, "
           "\"bytes\": %lld, \"errors\": %lld, \"ranks\": [",
           first ? "" : ", ", access, total > 0 ? mib / total : 0.0, total > 0 ? transfers / total : 0.0,
           transfers ? io_s * nranks / transfers : 0.0, o->block >> 10, o->xfer >> 10, open_s, io_s, close_s, total,
           bytes, errors);
    for (int r = 0; r < nranks; r++) {
        double *a = all + 5 * r;
        const char *h = hosts + (size_t)r * MPI_MAX_PROCESSOR_NAME;
        printf("%s{\"rank\": %d, \"host\": \"%s\", \"bytes\": %lld, \"start\": %.6f, \"open_s\": %.9f, "
               "\"wrrd_s\": %.9f, \"close_s\": %.9f, \"total_s\": %.9f, \"end\": %.6f}", r ? ", " : "", r, h,
               allc[2 * r], a[4], a[1] - a[0], a[2] - a[1], a[3] - a[2], a[3] - a[0], a[4] + a[3]);
    }
    printf("]}");
    free(all);
    free(allc);
}

int main(int argc, char **argv) {
    struct opts o = {.api = "mpiio", .segments = 1, .shift = 0};
    int c, phases = 0;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);
    while ((c = getopt(argc, argv, "o:t:b:s:a:FLceCwr")) != -1) {
        switch (c) {
        case 'o': o.path = optarg; break;
        case 't': o.xfer = size_arg(optarg, "-t"); break;
        case 'b': o.block = size_arg(optarg, "-b"); break;
        case 's': o.segments = size_arg(optarg, "-s"); break;
        case 'a': o.api = optarg; break;
        case 'F': o.fpp = 1; break;
        case 'L': o.local = 1; break;
        case 'c': o.collective = 1; break;
        case 'e': o.fsync_ = 1; break;
        case 'C': o.shift = 1; break;
        case 'w': o.do_write = 1; phases++; break;
        case 'r': o.do_read = 1; phases++; break;
        default: die("unknown option (see the usage in %s's source)", "cloudbox-mpiio");
        }
    }
    if (!phases) o.do_write = o.do_read = 1;
    if (!o.path) die("%s: -o PATH is required", "cloudbox-mpiio");
    if (!o.xfer || !o.block) die("%s: -t XFER and -b BLOCK are required", "cloudbox-mpiio");
    if (o.block % o.xfer) die("%s: -b must be a multiple of -t", "cloudbox-mpiio");
    if (o.xfer > 1 << 30) die("%s: -t is at most 1g", "cloudbox-mpiio");
    if (strcmp(o.api, "mpiio") && strcmp(o.api, "posix") && strcmp(o.api, "hdf5"))
        die("-a %s: allowed: mpiio, posix, hdf5", o.api);
    if (o.local && !o.fpp) die("%s: -L needs -F (a file per process)", "cloudbox-mpiio");
    if (o.local) o.shift = 0; /* another host's disk is not reachable from here */
    if (strcmp(o.api, "posix") == 0 && o.collective) die("%s: -c needs -a mpiio or hdf5", "cloudbox-mpiio");

    char me[MPI_MAX_PROCESSOR_NAME] = {0};
    int len;
    MPI_Get_processor_name(me, &len);
    char *hosts = malloc((size_t)MPI_MAX_PROCESSOR_NAME * nranks);
    MPI_Allgather(me, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, hosts, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, MPI_COMM_WORLD);
    char *buf = aligned_alloc(4096, (size_t)((o.xfer + 4095) / 4096 * 4096));
    if (!buf) die("%s: out of memory for the transfer buffer", "cloudbox-mpiio");
    for (long long i = 0; i < o.xfer; i++) buf[i] = (char)(i * 31 + rank);

    if (rank == 0) {
        int version, subversion;
        char lib[MPI_MAX_LIBRARY_VERSION_STRING];
        MPI_Get_version(&version, &subversion);
        MPI_Get_library_version(lib, &len);
        char *nl = strchr(lib, '\n');
        if (nl) *nl = 0;
        for (char *p = lib; *p; p++)
            if (*p == '"' || *p == '\\') *p = ' ';
        unsigned h5maj, h5min, h5rel;
        H5get_libversion(&h5maj, &h5min, &h5rel);
        printf("{\"tool\": \"cloudbox-mpiio\", \"api\": \"%s\", \"mpi\": \"%s\", \"hdf5\": \"%u.%u.%u\", "
               "\"ranks\": %d, \"path\": \"%s\", "
               "\"file_per_proc\": %d, \"collective\": %d, \"fsync\": %d, \"reorder\": %d, \"xfer\": %lld, "
               "\"block\": %lld, \"segments\": %lld, \"ops\": [",
               o.api, lib, h5maj, h5min, h5rel, nranks, o.path, o.fpp, o.collective, o.fsync_, o.shift, o.xfer, o.block, o.segments);
    }
    struct times t;
    int first = 1;
    if (o.do_write) {
        phase(&o, 1, buf, &t);
        report(&o, "write", &t, hosts, first);
        first = 0;
    }
    if (o.do_read) {
        phase(&o, 0, buf, &t);
        report(&o, "read", &t, hosts, first);
    }
    if (rank == 0) {
        printf("]}\n");
        fflush(stdout);
    }
    free(buf);
    free(hosts);
    MPI_Finalize();
    return 0;
}
