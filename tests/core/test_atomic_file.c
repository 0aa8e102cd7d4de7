/* What an output path names survives its writer (core/atomic_file.h): a
 * character device stays the device it was (same major and minor) and
 * takes the bytes in place, /dev/full's error reaches the caller, a FIFO
 * passes the bytes to its reader (one without a reader is an error, not a
 * hang), a chain of symbolic links (relative and absolute) stays links
 * and the file at its end is replaced, a dangling link creates the file
 * it names, and a directory, a block device or a loop of links is refused
 * with a message naming the path. Device nodes are made with mknod in a
 * temporary directory: the tests run as root, and a mknod that is not
 * permitted fails the test.
 *
 *   test_atomic_file */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "check.h"
#include "core/atomic_file.h"
#include "core/file.h"

static char dir[64];

static const char *at(const char *name)
{
    static char buf[4][256];
    static int next;
    char *p = buf[next++ % 4];
    snprintf(p, sizeof buf[0], "%s/%s", dir, name);
    return p;
}

/* The file's text ("" when it cannot be read). */
static const char *text_of(const char *path)
{
    static char buf[256];
    buf[0] = '\0';
    FILE *f = fopen(path, "r");
    if (!f) return buf;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = '\0';
    fclose(f);
    return buf;
}

static void put(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    CHECK(f && fputs(text, f) >= 0 && fclose(f) == 0, "%s: cannot write", path);
}

static int write_text(const char *path, const char *text, char *err, size_t errlen)
{
    return dt_afile_write_file(path, text, strlen(text), err, errlen);
}

static int make_node(const char *name, mode_t kind, int major, int minor)
{
    if (mknod(at(name), kind | 0666, makedev(major, minor)) == 0) return 0;
    CHECK(0, "mknod %s: %s (the tests run as root; this one needs device nodes)", at(name),
          strerror(errno));
    return -1;
}

/* Still a node of this kind and these numbers. */
static void check_node(const char *name, mode_t kind, int major, int minor)
{
    struct stat st;
    CHECK(lstat(at(name), &st) == 0 && (st.st_mode & S_IFMT) == kind &&
              (int)major(st.st_rdev) == major && (int)minor(st.st_rdev) == minor,
          "%s is no longer the device node %d,%d it was", name, major, minor);
}

/* Still a symbolic link, reading `to`. */
static void check_link(const char *name, const char *to)
{
    char buf[256];
    ssize_t n = readlink(at(name), buf, sizeof buf - 1);
    buf[n > 0 ? n : 0] = '\0';
    CHECK(n > 0 && strcmp(buf, to) == 0, "%s is no longer a link to %s ('%s')", name, to, buf);
}

static void test_devices(void)
{
    char err[512] = "";
    if (make_node("null", S_IFCHR, 1, 3) == 0) {
        char big[1 << 16];
        memset(big, 'x', sizeof big);
        CHECK(dt_afile_write_file(at("null"), big, sizeof big, err, sizeof err) == 0, "%s",
              err);
        check_node("null", S_IFCHR, 1, 3);
        CHECK(dt_check_output_file("--out", at("null"), err, sizeof err) == 0, "%s", err);
    }
    if (make_node("full", S_IFCHR, 1, 7) == 0) {
        CHECK_ERR(write_text(at("full"), "data", err, sizeof err), err, at("full"),
                  "No space left on device");
        check_node("full", S_IFCHR, 1, 7);
    }
    if (make_node("block", S_IFBLK, 7, 0) == 0) {
        CHECK_ERR(write_text(at("block"), "data", err, sizeof err), err, at("block"),
                  ": is a block device; give a file name");
        check_node("block", S_IFBLK, 7, 0);
    }
}

static void test_fifo(void)
{
    char err[512] = "", got[16] = "";
    CHECK(mkfifo(at("fifo"), 0666) == 0, "mkfifo: %s", strerror(errno));
    /* Nobody reads it yet: an error, not a wait without end. */
    CHECK_ERR(write_text(at("fifo"), "lost", err, sizeof err), err, at("fifo"),
              "a FIFO that no process reads");
    int reader = open(at("fifo"), O_RDONLY | O_NONBLOCK);
    CHECK(reader >= 0, "cannot open the FIFO to read it");
    CHECK(write_text(at("fifo"), "piped", err, sizeof err) == 0, "%s", err);
    CHECK(read(reader, got, sizeof got - 1) == 5 && strcmp(got, "piped") == 0,
          "the FIFO's reader got '%s', not 'piped'", got);
    dt_afile a;
    CHECK(dt_afile_open(&a, at("fifo"), err, sizeof err) == 0, "%s", err);
    int rc = dt_afile_pwrite(&a, 0, "x", 1, err, sizeof err);
    CHECK_ERR(rc, err, at("fifo"), "a FIFO, and this file is written out of order");
    dt_afile_abort(&a);
    struct stat st;
    CHECK(lstat(at("fifo"), &st) == 0 && S_ISFIFO(st.st_mode), "the FIFO is no longer one");
    close(reader);
}

static void test_links(void)
{
    char err[512] = "";
    /* chain -> sub/hop (relative) -> ../real.txt (relative to sub) */
    CHECK(mkdir(at("sub"), 0777) == 0, "mkdir");
    put(at("real.txt"), "old");
    CHECK(symlink("../real.txt", at("sub/hop")) == 0 && symlink("sub/hop", at("chain")) == 0,
          "symlink");
    CHECK(write_text(at("chain"), "new", err, sizeof err) == 0, "%s", err);
    check_link("chain", "sub/hop");
    check_link("sub/hop", "../real.txt");
    CHECK(strcmp(text_of(at("real.txt")), "new") == 0, "real.txt holds '%s', not 'new'",
          text_of(at("real.txt")));
    /* an absolute link, and a dangling one: its name is created */
    CHECK(symlink(at("real.txt"), at("abs")) == 0 && symlink("made.txt", at("dangling")) == 0,
          "symlink");
    CHECK(write_text(at("abs"), "newer", err, sizeof err) == 0, "%s", err);
    check_link("abs", at("real.txt"));
    CHECK(strcmp(text_of(at("real.txt")), "newer") == 0, "real.txt holds '%s', not 'newer'",
          text_of(at("real.txt")));
    CHECK(write_text(at("dangling"), "made", err, sizeof err) == 0, "%s", err);
    check_link("dangling", "made.txt");
    CHECK(strcmp(text_of(at("made.txt")), "made") == 0, "made.txt holds '%s'",
          text_of(at("made.txt")));
    /* the early check looks where the link leads */
    CHECK(symlink("nowhere/x", at("far")) == 0, "symlink");
    CHECK_ERR(dt_check_output_file("--out", at("far"), err, sizeof err), err, at("far"),
              "the directory", "nowhere does not exist");
}

static void test_refused(void)
{
    char err[512] = "";
    CHECK(mkdir(at("adir"), 0777) == 0 && symlink("adir", at("dirlink")) == 0, "setup");
    CHECK_ERR(write_text(at("adir"), "x", err, sizeof err), err, at("adir"),
              ": is a directory; give a file name");
    CHECK_ERR(write_text(at("dirlink"), "x", err, sizeof err), err, at("dirlink"),
              ": a link to a directory; give a file name");
    check_link("dirlink", "adir");
    CHECK(symlink("loop2", at("loop1")) == 0 && symlink("loop1", at("loop2")) == 0, "symlink");
    CHECK_ERR(write_text(at("loop1"), "x", err, sizeof err), err, at("loop1"),
              "symbolic links lead to no file name");
    CHECK_ERR(dt_check_output_file("--save-final", at("adir"), err, sizeof err), err,
              "--save-final", ": is a directory");
}

/* Nothing but what the cases made: no temporary file left anywhere. */
static void check_no_temporaries(const char *d)
{
    DIR *dp = opendir(d);
    struct dirent *e;
    while (dp && (e = readdir(dp)) != NULL)
        CHECK(!strstr(e->d_name, ".tmp."), "%s/%s: a temporary file is left", d, e->d_name);
    if (dp) closedir(dp);
}

int main(void)
{
    snprintf(dir, sizeof dir, "/tmp/test_atomic_file.XXXXXX");
    if (!mkdtemp(dir)) return perror("mkdtemp"), 1;
    test_devices();
    test_fifo();
    test_links();
    test_refused();
    check_no_temporaries(dir);
    check_no_temporaries(at("sub"));
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    return finish("test_atomic_file");
}
