#!/usr/bin/env python3
"""sparkfleet's file mover on the nodes: weights fetched once on the head, fanned out over the fabric,
and every copy proven by a manifest. Python 3 standard library only (it runs on DGX OS and inside
the serving image); installed by roles/fanout as /usr/local/libexec/sparkfleet/sfl_files.py.

A manifest is text: '#' header lines (key: value), then one line per file, sorted by path:
    <sha256>\\t<size in bytes>\\t<path relative to the directory>
Two nodes hold the same files when their manifests are byte-identical.

  sfl_files.py manifest DIR [--header KEY=VALUE ...]       print DIR's manifest
  sfl_files.py verify DIR MANIFEST                          exit 1 naming files missing or different
  sfl_files.py seal DIR --manifest OUT [--header ...]       write DIR's manifest to OUT (atomically)
  sfl_files.py fetch-http URL DEST --manifest OUT [--header ...] [--margin-gib G]
        URL serves <URL>.manifest and the files under <URL>/; resumed with HTTP ranges
  sfl_files.py fetch-dir SRC DEST --manifest OUT [--header ...] [--margin-gib G] [--io-timeout S]
  sfl_files.py fetch-hub REPO REVISION DEST [--margin-gib G]
        Hugging Face hub (run inside the serving image, which has huggingface_hub); the token is read
        by the hub client from the file HF_TOKEN_PATH names, never from the command line
  sfl_files.py land DIR --landed OUT [--interval S] -- COMMAND...
        run a fetch COMMAND into DIR and, while it runs, publish OUT: a manifest of the files that have
        landed so far (each hashed once it is in place and has not changed between two looks; rsync's
        temporary .name.XXXXXX files never), rewritten atomically as files land, its header saying
        `fetch: running`, then `fetch: done` or `fetch: failed <status>`. A worker's `pull --follow`
        reads it to pull each file as it lands instead of after the whole model. Exits with
        COMMAND's status; a TERM is passed on to it
  sfl_files.py pull RSYNC_URL DEST --manifest OUT [--streams N] [--bwlimit KIB] [--margin-gib G]
                   [--io-timeout S] [--follow]
        the head's copy over its rsync daemon (RSYNC_URL.manifest beside it), in N concurrent rsync
        streams (default 4) over disjoint sets of the manifest's files balanced by size. Each file
        arrives in DEST/.sparkfleet-partial/, is hashed there as soon as rsync finishes it (from the
        page cache, while the other files are still arriving) and is moved into DEST only when its
        sha256 is the head's manifest's; a file that differs is removed, never installed. Files
        already in DEST at the right size are hashed meanwhile and sent again only when they differ.
        An interrupted pull resumes from the partial file (only what is missing crosses the link).
        OUT, the head's manifest byte for byte, is written once every file is verified and in place.
        --bwlimit is the whole pull's cap, shared between the streams.
        With an http:// URL (the head's `serve`), the same pull over HTTP: each stream GETs its files
        one by one, hashing every byte as it is received (no second read), writes it with O_DIRECT
        where the filesystem takes it (around the page cache: open_direct), and resumes a partial file
        with a Range request after hashing what it holds. --follow (http:// only): while the head's
        fetch runs, pull each file its `land` list (URL.landed) names as it lands, verified against the
        list's sha256, polling once a second; once the list says `done`, the pull as above against the
        manifest the fetch wrote (a manifest there before is an older one: never read before), where a
        file already pulled with the manifest's sha256 is not hashed again. No list yet: the fetch has
        not begun, wait. A list that says the fetch failed ends the pull (exit 4)
  sfl_files.py serve DIR --address IP --port P --allow CIDR [--allow CIDR ...]
        read-only HTTP/1.0 server of DIR's regular files (GET, with a `bytes=N-` Range) for the clients
        in the CIDRs alone (403 to any other), bound to IP: the body leaves by sendfile(2), the page
        cache to the socket. Nothing else is answered: no listing, no path with a '..' or bookkeeping
        component, no symlink on the way, nothing but a regular file (404)
  sfl_files.py scrub DIR [--dry-run]
        print, one line each (kind TAB path), what under DIR is not a regular file or a directory:
        device nodes, fifos, sockets, symlinks that resolve outside DIR, setuid/setgid files; and
        remove it (--dry-run: only print). Run on every rank before a kernel-cache merge, as root,
        over a tree the engine may still write: the walk goes through directory descriptors and follows
        no symlink, and a directory swapped while walked is named ("directory swapped while
        scrubbed"), not entered; the scrub then exits 1 (the tree is still changing)
  --io-timeout S: rsync's --timeout, seconds without data before a stalled peer is given up
  (0: none); the whole command's limit is the caller's (sparkfleet/bounded.py wraps it)

Exit codes: 0 done, 1 verification failed (scrub: a directory swapped or an entry not dropped),
3 not enough free disk (nothing transferred), 2 usage; pull and fetch-dir: rsync's own exit code when a transfer fails (a re-run resumes), unless a file
also failed verification (1); an http:// pull whose transfer fails: 4 (a re-run resumes).
"""
import argparse
import concurrent.futures
import errno
import fcntl
import hashlib
import http.client
import http.server
import ipaddress
import math
import mmap
import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

# What any rsync of sparkfleet carries, whichever end runs it: regular files and directories only,
# nothing a root receiver would make privileged. --no-links: no symlink crosses (a manifest lists
# regular files only, so what crosses is what one can verify; none can lead a root reader out of the
# tree); --no-devices --no-specials: no device node, fifo or socket is made (-a's -D off, sent to the
# daemon too, which refuses -D and -l: roles/fanout's rsyncd.conf); --no-owner --no-group: what
# arrives is owned by the receiving root, not by a uid the sender chose; --chmod=ug-s: no setuid or
# setgid bit survives (rsync(1) at 3.5.0: --chmod applies to the permissions the sender supplied).
SAFE_RSYNC = ("--no-links", "--no-devices", "--no-specials", "--no-owner", "--no-group", "--chmod=ug-s")
PARTIAL = ".sparkfleet-partial"  # resumable downloads live here until verified
SKIP_DIRS = {PARTIAL, ".cache"}  # the hub client's own bookkeeping is not part of the model
GIB = 1024**3


def say(msg):
    # stderr: pyinfra shows a failed command's stderr, so a refusal's numbers reach the operator.
    print(f"sfl_files: {msg}", file=sys.stderr, flush=True)


def sha256_file(path, chunk=1024 * 1024):
    # One reused buffer the size of a cache: f.read() of 8 MiB allocated (and page-faulted) a fresh
    # block every time, ~1.4 GB/s against ~1.8 GB/s this way on a SHA-NI core.
    h = hashlib.sha256()
    buf = bytearray(chunk)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buf):
            h.update(view[:n])
    return h.hexdigest()


def listing(root):
    """{relative path: size} of the regular files under root (bookkeeping directories skipped)."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS)
        for name in filenames:
            full = os.path.join(dirpath, name)
            try:
                st = os.lstat(full)
            except FileNotFoundError:  # gone since its directory was read: rsync renamed its temporary
                continue  # file into place as it landed (`land` lists a directory a fetch is writing)
            if stat.S_ISREG(st.st_mode):
                out[os.path.relpath(full, root)] = st.st_size
    return out


def manifest_text(root, header=()):
    lines = [f"# {h}" for h in header]
    for rel, size in sorted(listing(root).items()):
        lines.append(f"{sha256_file(os.path.join(root, rel))}\t{size}\t{rel}")
    return "\n".join(lines) + "\n"


class ManifestError(ValueError):
    """A manifest line that names no file inside the directory: refused before a byte is written."""


def path_problem(rel):
    """Why `rel` cannot name a file inside a manifest's directory (None when it can): relative,
    normalised, no '.' or '..' component, no control character, no bookkeeping directory."""
    if not rel:
        return "empty path"
    if any(ord(c) < 32 or ord(c) == 127 for c in rel):
        return "control character in the path"
    if rel.startswith("/"):
        return "absolute path"
    parts = rel.split("/")
    if ".." in parts:
        return "'..' in the path"
    if "" in parts or "." in parts or "\\" in rel:
        return "path not normalised (empty or '.' component, or a backslash)"
    if parts[0] in SKIP_DIRS:
        return f"path inside {parts[0]}/ (sparkfleet's bookkeeping)"
    return None


def parse_manifest(text):
    """(header {key: value}, entries {path: (size, sha256)}). A line that is not
    '<64 hex>\\t<size>\\t<relative path>' with a confined path raises ManifestError naming it."""
    header, entries = {}, {}
    for n, line in enumerate(text.split("\n"), 1):
        if line.startswith("#"):
            key, _, value = line[1:].strip().partition(":")
            header[key.strip()] = value.strip()
        elif line.strip():
            fields = line.split("\t")
            if len(fields) != 3:
                raise ManifestError(f"manifest line {n}: want '<sha256>\\t<size>\\t<path>', found {line!r:.200}")
            sha, size, rel = fields
            if not sha or not sha.isascii() or not sha.isalnum():
                raise ManifestError(f"manifest line {n}: not a sha256 {sha!r:.80}: {line!r:.200}")
            if not size.isdigit() or not size.isascii():
                raise ManifestError(f"manifest line {n}: not a size in bytes {size!r:.40}: {line!r:.200}")
            why = path_problem(rel)
            if why:
                raise ManifestError(f"manifest line {n}: {why}: {rel!r:.200}")
            if rel in entries:
                raise ManifestError(f"manifest line {n}: {rel!r:.200} listed twice")
            entries[rel] = (int(size), sha)
    return header, entries


def confined(root, rel):
    """root/rel, refused (ManifestError) when an existing component of it is a symlink leaving root."""
    base = os.path.realpath(root)
    target = os.path.realpath(os.path.join(root, rel))
    if not target.startswith(base + os.sep):
        raise ManifestError(f"{rel!r}: resolves to {target}, outside {base} (a symlink on the way)")
    return os.path.join(root, rel)


def refuse_escapes(dest, entries, source):
    """Before a byte is written: no manifest path may leave dest (or its partial directory) through a
    symlink; the command ends naming the line's path otherwise."""
    try:
        for rel in entries:
            confined(dest, rel)
            confined(dest, os.path.join(PARTIAL, rel))
    except ManifestError as e:
        say(f"{source}: {e}; refused, nothing was written")
        sys.exit(1)


def checked_manifest(text, source):
    """parse_manifest for the CLI: a bad manifest ends the command naming the line, nothing written."""
    try:
        return parse_manifest(text)
    except ManifestError as e:
        say(f"{source}: {e}; refused, nothing was written")
        sys.exit(1)


def compare(entries, sizes, sha_of):
    """Lines naming each manifest file missing from `sizes` ({path: size}) or different there;
    sha_of(path) gives a present file's sha256 (hashed only when its size matches)."""
    problems = []
    for rel, (size, sha) in sorted(entries.items()):
        if rel not in sizes:
            problems.append(f"missing {rel}")
        elif sizes[rel] != size:
            problems.append(f"size {rel}: {sizes[rel]} bytes, manifest says {size}")
        elif sha_of(rel) != sha:
            problems.append(f"sha256 {rel} differs from the manifest")
    return problems


def differences(root, entries):
    """Lines naming each manifest file missing under root or different from it."""
    present = listing(root) if os.path.isdir(root) else {}
    return compare(entries, present, lambda rel: sha256_file(os.path.join(root, rel)))


def absent(entries, present):
    """Manifest paths missing from `present` ({path: size}) or with another size there, sorted."""
    return [rel for rel, (size, _) in sorted(entries.items()) if present.get(rel) != size]


def missing_bytes(root, entries):
    present = listing(root) if os.path.isdir(root) else {}
    return sum(entries[rel][0] for rel in absent(entries, present))


def check_disk(dest, need, margin_gib):
    """Stop before transferring anything when `need` bytes (+ margin) do not fit under dest."""
    probe = dest
    while not os.path.exists(probe):
        probe = os.path.dirname(probe) or "/"
    free = shutil.disk_usage(probe).free
    if need + margin_gib * GIB > free:
        say(f"not enough disk under {probe}: {need / GIB:.2f} GiB to fetch + {margin_gib:.2f} GiB margin, "
            f"{free / GIB:.2f} GiB free; nothing was transferred")
        sys.exit(3)
    say(f"disk: {need / GIB:.2f} GiB to fetch, {free / GIB:.2f} GiB free under {probe}")


def write_atomic(path, text):
    """A temporary file, fsynced, renamed into place, then its directory fsynced: after a power cut
    the manifest is the old one or the new one, whole."""
    directory = os.path.dirname(path)
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".manifest-")
    with os.fdopen(fd, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)
    dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def finish(dest, out, header, entries=None):
    """Write dest's manifest, verified against entries when the source gave a manifest: one hashing
    pass over dest serves both (weights are ~164 GiB)."""
    text = manifest_text(dest, header)
    _, mine = parse_manifest(text)
    if entries is not None:
        problems = compare(entries, {rel: size for rel, (size, _) in mine.items()}, lambda rel: mine[rel][1])
        if problems:
            say(f"{dest} does not match the source's manifest:\n  " + "\n  ".join(problems))
            sys.exit(1)
    write_atomic(out, text)
    say(f"manifest {out}: {len(mine)} files")


def http_get(url, dest_file, offset=0):
    req = urllib.request.Request(url, headers={"Range": f"bytes={offset}-"} if offset else {})
    with urllib.request.urlopen(req, timeout=60) as r:
        mode = "ab" if offset and r.status == 206 else "wb"  # 200: the server ignored the range
        with open(dest_file, mode) as f:
            # 1 MiB reads: each lands in the file as it arrives, so the deploy's progress probe (the model
            # directory's bytes) sees a slow file grow, not appear whole at its end
            shutil.copyfileobj(r, f, 1024 * 1024)


def fetch_http(a):
    base = a.url.rstrip("/")
    with urllib.request.urlopen(base + ".manifest", timeout=60) as r:
        _, entries = checked_manifest(r.read().decode(), base + ".manifest")
    refuse_escapes(a.dest, entries, base + ".manifest")
    if not entries:
        say(f"{base}.manifest lists no files")
        sys.exit(1)
    check_disk(a.dest, missing_bytes(a.dest, entries), a.margin_gib)
    partial_dir = os.path.join(a.dest, PARTIAL)
    present = listing(a.dest) if os.path.isdir(a.dest) else {}
    for rel, (size, sha) in sorted(entries.items()):
        final = os.path.join(a.dest, rel)
        if present.get(rel) == size and sha256_file(final) == sha:
            continue
        part = os.path.join(partial_dir, rel)
        os.makedirs(os.path.dirname(part), exist_ok=True)
        have = os.path.getsize(part) if os.path.exists(part) else 0
        if have > size:
            os.remove(part)
            have = 0
        if have < size:
            say(f"fetch {rel} ({size} bytes" + (f", resuming at {have})" if have else ")"))
            http_get(f"{base}/{urllib.parse.quote(rel)}", part, have)
        if sha256_file(part) != sha:
            os.remove(part)
            say(f"{rel}: sha256 differs from {base}.manifest (partial removed; a re-run fetches it again)")
            sys.exit(1)
        os.makedirs(os.path.dirname(final), exist_ok=True)
        os.replace(part, final)
    shutil.rmtree(partial_dir, ignore_errors=True)
    finish(a.dest, a.manifest, a.header, entries)


def fetch_dir(a):
    if not os.path.isdir(a.src):
        say(f"source directory {a.src} does not exist")
        sys.exit(1)
    need = missing_bytes(a.dest, {rel: (size, "") for rel, size in listing(a.src).items()})
    check_disk(a.dest, need, a.margin_gib)
    os.makedirs(a.dest, exist_ok=True)
    rsync(["--partial-dir=" + PARTIAL, a.src.rstrip("/") + "/", a.dest + "/"], a.io_timeout)
    finish(a.dest, a.manifest, a.header)


def fetch_hub(a):
    from huggingface_hub import HfApi, snapshot_download  # the serving image's own client

    info = HfApi().model_info(a.repo, revision=a.revision, files_metadata=True)
    sizes = {s.rfilename: (s.size or 0, "") for s in info.siblings}
    check_disk(a.dest, missing_bytes(a.dest, sizes), a.margin_gib)
    say(f"hub {a.repo} at {a.revision} (commit {info.sha}): {len(sizes)} files")
    snapshot_download(a.repo, revision=info.sha, local_dir=a.dest)
    print(f"resolved-revision={info.sha}", flush=True)


LANDED_HEADER = "sparkfleet landing v1"
# rsync's temporary file for NAME while it arrives (receiver.c get_tmpname: ".NAME.XXXXXX"): never landed.
RSYNC_TEMP = re.compile(r"^\..+\.[A-Za-z0-9]{6}$")


def landed_text(entries, fetch):
    lines = [f"# {LANDED_HEADER}", f"# fetch: {fetch}"]
    lines += [f"{sha}\t{size}\t{rel}" for rel, (size, sha) in sorted(entries.items())]
    return "\n".join(lines) + "\n"


class Landing:
    """What has landed under root: each regular file in place whose size and mtime did not change
    between two scans, hashed once (again only when it changes)."""

    def __init__(self, root):
        self.root, self.hashed, self.last = root, {}, {}  # hashed: path -> ((size, mtime_ns), sha256)

    @property
    def entries(self):
        """{path: (size, sha256)} of what has landed: the manifest lines of the list."""
        return {rel: (sig[0], sha) for rel, (sig, sha) in self.hashed.items()}

    def scan(self, final=False):
        """One look; True when the landed set changed. `final`: the fetch has ended, so nothing is
        still being written: every file in place is landed without a second look."""
        now = {}
        for rel in listing(self.root) if os.path.isdir(self.root) else {}:
            if RSYNC_TEMP.match(os.path.basename(rel)):
                continue
            try:
                st = os.stat(os.path.join(self.root, rel))
            except OSError:
                continue
            now[rel] = (st.st_size, st.st_mtime_ns)
        changed = False
        for rel in [r for r in self.hashed if r not in now]:  # removed meanwhile
            del self.hashed[rel]
            changed = True
        for rel, sig in sorted(now.items()):
            if self.hashed.get(rel, (None,))[0] == sig or (self.last.get(rel) != sig and not final):
                continue  # hashed as it is, or new or still changing since the last look
            try:
                sha = sha256_file(os.path.join(self.root, rel))
                st = os.stat(os.path.join(self.root, rel))
            except OSError:
                continue
            if (st.st_size, st.st_mtime_ns) != sig:
                continue  # changed while hashed: the next look
            self.hashed[rel] = (sig, sha)
            changed = True
        self.last = now
        return changed


def land(a):
    command = a.command
    if not command:
        say("land: no command to run (land DIR --landed OUT -- COMMAND...)")
        return 2
    landing = Landing(a.dir)
    landing.scan()  # the files in place before the fetch: hashed from the second look on
    write_atomic(a.landed, landed_text({}, "running"))
    proc = subprocess.Popen(command)
    before = signal.signal(signal.SIGTERM, lambda signum, _frame: proc.send_signal(signum))
    try:
        while proc.poll() is None:
            time.sleep(a.interval)
            if landing.scan():
                write_atomic(a.landed, landed_text(landing.entries, "running"))
    finally:
        signal.signal(signal.SIGTERM, before)
    rc = proc.wait()
    rc = 128 - rc if rc < 0 else rc  # killed by a signal: the shell's 128 + N, as a status
    landing.scan(final=True)
    write_atomic(a.landed, landed_text(landing.entries, "done" if rc == 0 else f"failed {rc}"))
    return rc


def shown(rel):
    """A path as one line of output: as it is, or quoted with escapes when it holds a control character."""
    return rel if rel.isprintable() else ascii(rel)


# The scrub runs as root over a tree the engine (another uid, in a container) may still be writing:
# every call below goes through a directory file descriptor opened without following a symlink, so a
# directory swapped for a symlink mid-walk leads nowhere outside the tree (issue 43 item 5). A path
# string from the root is never handed to a call that changes anything.
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
SWAPPED = "directory swapped while scrubbed"
MAX_HOPS = 40  # symlinks followed while judging one (Linux's own limit, path_resolution(7))


def resolution(rootfd, base, dir_parts, target):
    """(inside, where) of a symlink in directory dir_parts (components below the tree's root) pointing at
    `target`: resolved physically, component by component, each symlink met on the way read through the
    root's descriptor (lstat and readlink only, nothing opened). An absolute target is inside only when
    it names a path under `base` (the root's real path). `where` is the absolute path it resolves to."""
    stack = list(dir_parts)
    pending = target.split("/")
    if target.startswith("/"):
        if target != base and not target.startswith(base + "/"):
            return False, os.path.realpath(target)
        stack, pending = [], target[len(base):].split("/")
    hops = MAX_HOPS
    while pending:
        c = pending.pop(0)
        if c in ("", "."):
            continue
        if c == "..":
            if not stack:  # above the root: the rest resolves outside (named, physically, for the line only)
                return False, os.path.realpath(os.path.join(os.path.dirname(base), *pending))
            stack.pop()
            continue
        stack.append(c)
        rel = "/".join(stack)
        try:
            st = os.stat(rel, dir_fd=rootfd, follow_symlinks=False)
        except OSError:  # absent: the rest is lexical, as realpath's is
            continue
        if stat.S_ISLNK(st.st_mode):
            hops -= 1
            if hops < 0:
                return False, "a loop of symlinks"
            link = os.readlink(rel, dir_fd=rootfd)
            stack.pop()
            if link.startswith("/"):
                if link != base and not link.startswith(base + "/"):
                    return False, os.path.realpath(os.path.join(link, *pending))
                stack, pending = [], link[len(base):].split("/") + pending
            else:
                pending = link.split("/") + pending
    return True, os.path.join(base, *stack)


def _kind(st, link, where, inside):
    """What a non-directory entry is, when foreign (None: a regular file or a symlink staying inside)."""
    mode = st.st_mode
    if stat.S_ISLNK(mode):
        return None if inside else f"symlink to {link} (resolves to {where}, outside the tree)"
    if stat.S_ISBLK(mode) or stat.S_ISCHR(mode):
        kind = "block device" if stat.S_ISBLK(mode) else "character device"
        return f"{kind} {os.major(st.st_rdev)},{os.minor(st.st_rdev)} mode {stat.S_IMODE(mode):04o}"
    if stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode):
        return "fifo" if stat.S_ISFIFO(mode) else "socket"
    return _bits(st, "file")


def _bits(st, what):
    mode = st.st_mode
    if not mode & (stat.S_ISUID | stat.S_ISGID):
        return None
    bits = " and ".join(b for b, m in (("setuid", stat.S_ISUID), ("setgid", stat.S_ISGID)) if mode & m)
    return f"{bits} {what} mode {stat.S_IMODE(mode):04o}"


def walk_foreign(root, act, failed):
    """Yield (kind, path relative to root) of each foreign entry under root, depth first, each
    directory's names sorted; with `act`, drop it once the consumer has taken the line (a non-directory
    unlinked from its directory's descriptor, a setuid/setgid directory's bits cleared through its own).
    A directory is entered only when the descriptor opened for it (O_NOFOLLOW) is the inode its parent
    listed (st_dev, st_ino); otherwise it is yielded as swapped and not entered. Drops that fail are
    appended to `failed` ((rel, reason)); nothing outside the tree is ever changed or opened."""
    import errno

    try:
        rootfd = os.open(root, DIR_FLAGS)
    except FileNotFoundError:
        return
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR):
            yield "not a directory (a symlink or another kind), not entered", "."
            failed.append((".", "the tree's root is not a directory"))
            return
        raise
    base = os.path.realpath(f"/proc/self/fd/{rootfd}") if os.path.isdir("/proc/self/fd") else os.path.realpath(root)

    def scan(dfd, parts):
        for name in sorted(os.listdir(dfd)):
            rel = "/".join(parts + [name])
            try:
                st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
            except FileNotFoundError:
                continue
            if stat.S_ISDIR(st.st_mode):
                try:
                    sub = os.open(name, DIR_FLAGS, dir_fd=dfd)
                except FileNotFoundError:
                    continue
                except OSError as e:
                    if e.errno not in (errno.ELOOP, errno.ENOTDIR):
                        raise
                    yield f"{SWAPPED} (now a symlink or not a directory), not entered", rel
                    failed.append((rel, SWAPPED))
                    continue
                try:
                    now = os.fstat(sub)
                    if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
                        yield f"{SWAPPED} (another directory now), not entered", rel
                        failed.append((rel, SWAPPED))
                        continue
                    kind = _bits(now, "directory")
                    if kind:
                        yield kind, rel
                        if act:
                            os.fchmod(sub, stat.S_IMODE(now.st_mode) & ~(stat.S_ISUID | stat.S_ISGID))
                    yield from scan(sub, parts + [name])
                finally:
                    os.close(sub)
                continue
            link, where, inside = None, None, True
            if stat.S_ISLNK(st.st_mode):
                try:
                    link = os.readlink(name, dir_fd=dfd)
                except OSError:  # gone or replaced since the lstat: judged on the next scrub
                    continue
                inside, where = resolution(rootfd, base, parts, link)
            kind = _kind(st, link, where, inside)
            if kind:
                yield kind, rel
                if act:
                    # unlinkat(2) removes the entry itself, never what a symlink names; a directory put
                    # here since the lstat is refused by it (EISDIR) and left, named.
                    try:
                        os.unlink(name, dir_fd=dfd)
                    except FileNotFoundError:
                        pass
                    except OSError as e:
                        failed.append((rel, e.strerror))

    try:
        yield from scan(rootfd, [])
    finally:
        os.close(rootfd)


def foreign(root):
    """[(kind, path relative to root)] of what under root is neither a regular file nor a directory
    nor a symlink resolving inside root, and of setuid/setgid entries, sorted by path; nothing is
    followed (a symlink is judged by where it resolves, physically, every link on the way included),
    and a directory swapped while walked is named, not entered (walk_foreign)."""
    return sorted(walk_foreign(root, False, []), key=lambda kr: kr[1])


def scrub(a):
    """Print what under a.dir is foreign, one `kind<TAB>path` line each (walk_foreign's order), and drop
    it: removed, or for a setuid/setgid directory its bits cleared (its contents are judged on their
    own). Returns 1, naming them on stderr, when a directory was swapped mid-walk or an entry could
    not be dropped (the tree is still being changed: not to be merged), else 0."""
    failed = []
    for kind, rel in walk_foreign(a.dir, not a.dry_run, failed):
        print(f"{kind}\t{shown(rel)}", flush=True)
    if failed and not a.dry_run:
        say(f"{a.dir}: not scrubbed whole: " + "; ".join(f"{shown(rel)}: {why}" for rel, why in failed))
        return 1
    return 0


def rsync(args, io_timeout=0):
    # --timeout: a peer that sends nothing for io_timeout seconds ends the transfer (exit 30), the
    # partial file kept for the next run; the caller bounds the whole transfer.
    cmd = ["rsync", "--archive", *SAFE_RSYNC, "--human-readable", "--stats",
           *([f"--timeout={io_timeout}"] if io_timeout else []), *args]
    done = subprocess.run(cmd)
    if done.returncode != 0:
        say(f"rsync exited {done.returncode}; a re-run resumes from what arrived")
        sys.exit(done.returncode)


STREAMS = 4  # sparkfleet/model/fanout.py's fanout_streams default; the reasons are there
KEEP = ".sfl-keep"  # in each of the stage's partial-dirs while a pull runs (Pull.transfer says why)
DONE = "sfl-done "  # --out-format prefix of a line rsync prints for each file it transferred


def balance(sizes, n):
    """`sizes` ({path: bytes}) split into at most n lists whose byte totals are as even as the largest
    first, onto the lightest, rule makes them; each path in exactly one list, each list sorted."""
    groups = [[0, []] for _ in range(min(n, len(sizes)))]
    for rel, size in sorted(sizes.items(), key=lambda kv: (-kv[1], kv[0])):
        lightest = min(groups, key=lambda g: g[0])
        lightest[0] += size
        lightest[1].append(rel)
    return [sorted(rels) for _, rels in groups]


class Pull:
    """One pull's files into dest through stage (dest/.sparkfleet-partial): rsync streams put whole
    files in stage, a pool of hashing threads moves each into dest once its sha256 is the manifest's."""

    def __init__(self, src, dest, a):
        self.src, self.dest, self.a, self.entries = src, dest, a, {}
        self.stage = os.path.join(dest, PARTIAL)
        self.pool = concurrent.futures.ThreadPoolExecutor(max_workers=a.streams)
        self.lock = threading.Lock()
        self.verified, self.problems, self.crossed, self.handled = set(), [], 0, set()
        self.procs = []

    def launch(self):
        """a.streams rsyncs connecting to the head's daemon, each waiting on stdin for its list of files:
        rsync reads --files-from only once connected, and an empty list transfers nothing."""
        bwlimit = math.ceil(self.a.bwlimit / self.a.streams) if self.a.bwlimit else 0  # the cap is the pull's
        # Without --delay-updates: rsync's "installed" is stage/<path>; dest only ever gets verified files.
        # --no-whole-file: the partial file is the basis of a resumed transfer even between local paths.
        # --out-format with %b: rsync prints the line once the file is received (with %n alone, before).
        cmd = ["rsync", "--archive", *SAFE_RSYNC, "--no-whole-file", "--partial-dir=" + PARTIAL, "--from0", "--files-from=-",
               f"--out-format={DONE}%b %n", *([f"--timeout={self.a.io_timeout}"] if self.a.io_timeout else []),
               *([f"--bwlimit={bwlimit}"] if bwlimit else []), self.src + "/", self.stage + "/"]
        procs = [subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
                 for _ in range(self.a.streams)]
        self.procs += procs
        return procs

    def stop(self, signum, _frame):
        """TERM (`timeout` sends it to the whole group): passed on to the streams, whose ends are then
        awaited, so the pull exits with rsync's code once each has kept its partial file, not before
        them, leaving them to write their log lines into a broken pipe."""
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signum)

    @staticmethod
    def release(procs):
        """Streams given no files (or no more): their lists end, they exit having transferred nothing."""
        for proc in procs:
            if not proc.stdin.closed:
                try:
                    proc.stdin.close()
                except BrokenPipeError:
                    pass
        for proc in procs:
            proc.wait()

    def install(self, rel):
        try:
            self._install(rel)
        except OSError as e:  # a hashing thread's failure would otherwise vanish with its future
            with self.lock:
                self.problems.append(f"{rel}: {e}")

    def _install(self, rel):
        """Hash stage/rel; move it into dest when it is the manifest's, remove it when it is not."""
        staged = os.path.join(self.stage, rel)
        size, sha = self.entries[rel]
        self.settle(rel, os.path.getsize(staged) == size and sha256_file(staged) == sha)

    def settle(self, rel, matches):
        """stage/rel into dest when `matches` (its size and sha256 are the manifest's), else removed."""
        staged = os.path.join(self.stage, rel)
        if not matches:
            os.remove(staged)
            with self.lock:
                self.problems.append(f"sha256 {rel} differs from the head's manifest (removed, not installed; "
                                     "a re-run fetches it again)")
            return
        final = os.path.join(self.dest, rel)
        os.makedirs(os.path.dirname(final), exist_ok=True)
        os.replace(staged, final)
        with self.lock:
            self.verified.add(rel)

    def in_place(self, rel):
        """True when dest/rel is already the manifest's file (no transfer needed)."""
        try:
            sha = sha256_file(os.path.join(self.dest, rel))
        except OSError:
            sha = None
        if sha != self.entries[rel][1]:
            say(f"{rel}: in place at the right size but its sha256 differs from the head's manifest; sent again")
            return False
        with self.lock:
            self.verified.add(rel)
        return True

    def stream(self, proc, rels, codes, index):
        try:
            proc.stdin.write("".join(rel + "\0" for rel in rels))
            proc.stdin.close()
        except BrokenPipeError:  # rsync already gone: it said why on stderr, its exit code is below
            pass
        for line in proc.stdout:
            if not line.startswith(DONE):
                sys.stdout.write(line)
                continue
            crossed, _, rel = line[len(DONE):].rstrip("\n").partition(" ")
            with self.lock:
                self.crossed += int(crossed) if crossed.isdigit() else 0
                if rel not in self.entries or rel in self.handled:
                    continue
            # rsync prints the line just before renaming its temporary file to stage/<path>.
            staged = os.path.join(self.stage, rel)
            while not os.path.exists(staged) and proc.poll() is None:
                time.sleep(0.002)
            if os.path.exists(staged):
                with self.lock:
                    self.handled.add(rel)
                self.pool.submit(self.install, rel)
        codes[index] = proc.wait()

    def transfer(self, rels, procs):
        """rsync's first failing exit code over the streams (procs, from launch) carrying rels; 0: all arrived."""
        groups = balance({rel: self.entries[rel][0] for rel in rels}, len(procs))
        # Made here, not by the streams: two rsyncs making one directory at once, one fails (mkdir: File
        # exists); for the partial-dir, on a TERM to them all, that one drops its partial file. A file
        # in each partial-dir keeps it: rsync removes one it emptied, for the next to race on again.
        for d in {os.path.dirname(os.path.join(self.stage, rel)) for rel in rels}:
            os.makedirs(os.path.join(d, PARTIAL), exist_ok=True)
            open(os.path.join(d, PARTIAL, KEEP), "a").close()
        groups += [[]] * (len(procs) - len(groups))
        codes = [0] * len(procs)
        threads = [threading.Thread(target=self.stream, args=(p, g, codes, i)) for i, (p, g) in enumerate(zip(procs, groups))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return next((c for c in codes if c), 0)

    def run(self, entries, procs):
        self.entries = entries
        present = listing(self.dest) if os.path.isdir(self.dest) else {}
        # Whole files left in stage by a pull stopped between rsync and the hash: judged first, so a
        # stream never finds one of its files already there.
        leftovers = []
        for rel, (size, _) in sorted(entries.items()):
            staged = os.path.join(self.stage, rel)
            if os.path.isfile(staged) and not os.path.islink(staged):
                if os.path.getsize(staged) == size:
                    leftovers.append(self.pool.submit(self.install, rel))
                    continue
                # Not one rsync finished for this manifest (those have its size): a top-level partial
                # file of the layout before the stage, or an older version. Either is a fair basis for
                # rsync's delta (sha256 judges the result) where a stream would otherwise find it.
                part = os.path.join(os.path.dirname(staged), PARTIAL, os.path.basename(staged))
                if os.path.exists(part):
                    os.remove(staged)
                else:
                    os.makedirs(os.path.dirname(part), exist_ok=True)
                    os.replace(staged, part)
        concurrent.futures.wait(leftovers)
        todo = [rel for rel in absent(entries, present) if rel not in self.verified]
        # Files already in dest are hashed while the missing ones arrive; one that differs goes again.
        checks = {rel: self.pool.submit(self.in_place, rel) for rel in sorted(entries)
                  if rel not in todo and rel not in self.verified}
        code = self.transfer(todo, procs)
        again = [rel for rel, f in checks.items() if not f.result()]
        if again and not code:
            code = self.transfer(again, self.launch())
        self.pool.shutdown(wait=True)
        return code


# Node to node over the fabric: never through a proxy the environment may name for the uplink.
FABRIC = urllib.request.build_opener(urllib.request.ProxyHandler({}))
HTTP_FAILED = 4  # an http:// pull's exit code when a transfer failed (rsync's own codes are its)
CHUNK = 1024 * 1024  # one read of the socket, hashed and written at once (sha256_file's reasons)


# The worker's writes of a pull over HTTP bypass the page cache (O_DIRECT, in whole blocks from a
# page-aligned buffer): the bytes were hashed in the process's buffer already and nothing on the worker
# reads them until the engine loads, so the page cache would only cost the copy and, once memory is
# full, the reclaim of other pages to hold it. Measured on the lab (docs/performance.md, the verified
# fan-out): buffered writes of a fresh 512 MiB file took 1.0 core-second where memory had to be
# reclaimed, O_DIRECT 0.04. On a Spark the page cache shares the unified memory the GPU allocates from.
DIRECT_BLOCK = 4096  # a multiple of every Linux filesystem's logical block size that O_DIRECT asks for


def open_direct(path, have):
    """(fd, direct) of `path` opened for a pull's writes from offset `have` (appending when > 0): with
    O_DIRECT when `have` is whole blocks and the filesystem takes it (tmpfs, before Linux 6.6, does not:
    EINVAL), else buffered."""
    flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if have else os.O_TRUNC)
    if have % DIRECT_BLOCK == 0:
        try:
            return os.open(path, flags | os.O_DIRECT, 0o644), True
        except OSError as e:
            if e.errno != errno.EINVAL:
                raise
    return os.open(path, flags, 0o644), False


def buffered(fd):
    """fd's O_DIRECT off: for a file's last, partial block, or a filesystem that refuses a direct write."""
    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_DIRECT)


def write_chunk(fd, chunk, direct):
    """chunk written at fd's end; returns whether fd still writes directly. A chunk that is not whole
    blocks (the file's tail) is written buffered, as is everything after a direct write refused (EINVAL)."""
    if direct and len(chunk) % DIRECT_BLOCK:
        buffered(fd)
        direct = False
    try:
        os.write(fd, chunk)
    except OSError as e:
        if not direct or e.errno != errno.EINVAL:
            raise
        buffered(fd)
        direct = False
        os.write(fd, chunk)
    return direct


class Stopped(Exception):
    """A TERM reached an http:// pull: each stream ends at its next read, its partial file kept."""


class HttpPull(Pull):
    """Pull over the head's `serve`: the same stage, verification and installation as the rsync
    streams', with each file's sha256 taken from the bytes as they are received (the rsync pull hashes
    each file again once it is whole). A file lands in stage/<path> and is installed once its size and
    sha256 are the manifest's; a shorter one left there is resumed (its bytes hashed, the rest asked
    for with a Range); a failed stream stops, keeping its partial file, and the pull exits 4."""

    def __init__(self, src, dest, a):
        super().__init__(src, dest, a)
        self.rate = a.bwlimit * 1024  # bytes per second for the whole pull (0: none), as rsync's KiB
        self.paced = time.monotonic()
        self.stopping = False
        self.failures = []

    def launch(self):
        return []  # no processes: the streams are this process's threads

    @staticmethod
    def release(procs):
        pass

    def stop(self, signum, _frame):
        self.stopping = True

    def pace(self, n):
        """The shared cap: each chunk reserves its share of time after the previous ones' and its
        stream waits until then, so the pull as a whole never runs ahead of the rate."""
        if not self.rate:
            return
        with self.lock:
            now = time.monotonic()
            self.paced = max(self.paced, now) + n / self.rate
            wait = self.paced - now
        if wait > 0:
            time.sleep(wait)

    def fetch(self, rel):
        """stage/rel whole from the head (resuming what is there), then verified and installed."""
        size, sha = self.entries[rel]
        staged = os.path.join(self.stage, rel)
        os.makedirs(os.path.dirname(staged), exist_ok=True)
        rsync_part = os.path.join(os.path.dirname(staged), PARTIAL, os.path.basename(staged))
        if os.path.isfile(rsync_part) and not os.path.exists(staged):
            os.replace(rsync_part, staged)  # an rsync pull's partial file: as good a start as any
        h = hashlib.sha256()
        have = os.path.getsize(staged) if os.path.isfile(staged) and not os.path.islink(staged) else 0
        if have > size:
            os.remove(staged)
            have = 0
        if have:
            with open(staged, "rb", buffering=0) as f:  # what is here already, hashed before more is asked
                buf = bytearray(CHUNK)
                view = memoryview(buf)
                while n := f.readinto(buf):
                    h.update(view[:n])
        if have < size:
            request = urllib.request.Request(f"{self.src}/{urllib.parse.quote(rel)}",
                                             headers={"Range": f"bytes={have}-"} if have else {})
            with FABRIC.open(request, timeout=self.a.io_timeout or None) as r:
                if have and r.status != 206:
                    raise OSError(f"{rel}: the server answered a Range request with {r.status}")
                fd, direct = open_direct(staged, have)
                buf = mmap.mmap(-1, CHUNK)  # page-aligned, as O_DIRECT wants the memory it writes from
                view = memoryview(buf)
                try:
                    while have < size:
                        if self.stopping:
                            raise Stopped()
                        n = r.readinto(view)
                        if not n:
                            raise OSError(f"{rel}: the connection ended at {have} of {size} bytes")
                        h.update(view[:n])
                        # the deploy's progress probe sees the file grow
                        direct = write_chunk(fd, view[:n], direct)
                        have += n
                        with self.lock:
                            self.crossed += n
                        self.pace(n)
                finally:
                    os.close(fd)
                    view.release()
                    buf.close()
        self.settle(rel, have == size and h.hexdigest() == sha)

    def stream(self, rels):
        for rel in rels:
            try:
                self.fetch(rel)
            except Stopped:
                with self.lock:
                    self.failures.append("stopped by a signal")
                return
            except (OSError, http.client.HTTPException) as e:  # HTTPError, timeouts, a short body
                with self.lock:  # the stream goes on with its next file, as an rsync stream does
                    self.failures.append(f"{rel}: {e}")

    def transfer(self, rels, procs):
        groups = balance({rel: self.entries[rel][0] for rel in rels}, self.a.streams)
        threads = [threading.Thread(target=self.stream, args=(g,)) for g in groups]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if self.failures:
            say("transfer failed: " + "; ".join(self.failures))
            return HTTP_FAILED
        return 0


def http_text(url, io_timeout, missing_ok=False):
    """The text at `url` over the fabric; `missing_ok`: None when the server has no such file (404).
    Any other failure (and a 404 otherwise) ends the pull, exit 4, naming the URL."""
    try:
        with FABRIC.open(url, timeout=io_timeout or None) as r:
            return r.read().decode()
    except urllib.error.HTTPError as e:
        if missing_ok and e.code == 404:
            return None
        say(f"{url}: {e}; a re-run resumes from what arrived")
        sys.exit(HTTP_FAILED)
    except (OSError, http.client.HTTPException) as e:
        say(f"{url}: {e}; a re-run resumes from what arrived")
        sys.exit(HTTP_FAILED)


def follow(a, src, job, poll=1.0):
    """--follow: until the head's fetch has ended, pull each file it has landed (src.landed, `land`'s
    list) as it lands, verified against that list. Returns (the manifest's text, {path: sha256} of
    what this pull installed or found in place with that sha256). The head's manifest is read only once
    the list says the fetch is done: until then a manifest there is an older one (the fetch writes its
    own last), and no list yet means the fetch has not begun (the deploy removes the last one first)."""
    held, told = {}, None
    while True:
        landed = http_text(src + ".landed", a.io_timeout, missing_ok=True)
        header, entries = checked_manifest(landed, src + ".landed") if landed is not None else ({}, {})
        fetch = header.get("fetch", "not started")
        if fetch == "done":
            return http_text(src + ".manifest", a.io_timeout), held  # written before the list said done
        refuse_escapes(a.dest, entries, src + ".landed")
        new = {rel: e for rel, e in entries.items() if held.get(rel) != e[1]}
        if new:
            check_disk(a.dest, missing_bytes(a.dest, new), a.margin_gib)
            os.makedirs(a.dest, exist_ok=True)
            job.entries = {**job.entries, **new}
            present = listing(a.dest)
            job.verified -= set(new)
            sent = absent(new, present)
            for rel in sorted(set(new) - set(sent)):  # in place at its size (an earlier pull's): hashed
                if not job.in_place(rel):
                    sent.append(rel)
            if job.transfer(sorted(sent), []):
                say("the transfer failed; a re-run resumes from what arrived")
                sys.exit(HTTP_FAILED)
            # A file the head replaced between its list and the GET differs from the list: not held,
            # fetched again once the list names its new sha256 (or the manifest does).
            job.problems.clear()
            held.update({rel: sha for rel, (_, sha) in new.items() if rel in job.verified})
        if fetch.startswith("failed"):
            say(f"the head's fetch {fetch} ({src}.landed; no manifest): a re-run resumes from what arrived")
            sys.exit(HTTP_FAILED)
        if told != (fetch, len(held)):
            say(f"following the head's fetch ({fetch}): {len(held)} file(s) landed and pulled so far")
            told = (fetch, len(held))
        time.sleep(poll)


class Serve(http.server.BaseHTTPRequestHandler):
    """`serve`'s requests: GET of a regular file under the root, for an allowed client."""

    root, allowed = "/nonexistent", ()
    protocol_version = "HTTP/1.0"  # one file per connection: nothing to keep alive between shards
    server_version = "sfl_files"
    sys_version = ""

    def log_message(self, *args):  # nothing per request: the pulls log on the worker
        pass

    def do_GET(self):
        client = ipaddress.ip_address(self.client_address[0])
        if not any(client in net for net in self.allowed):
            return self.send_error(403)
        rel = urllib.parse.unquote(urllib.parse.urlsplit(self.path).path).lstrip("/")
        if path_problem(rel) or any(part in SKIP_DIRS for part in rel.split("/")):
            return self.send_error(404)
        try:
            fd = os.open(confined(self.root, rel), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except (OSError, ManifestError):
            return self.send_error(404)
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            os.close(fd)
            return self.send_error(404)
        with os.fdopen(fd, "rb", buffering=0) as f:
            start, ask = 0, self.headers.get("Range", "")
            if ask.startswith("bytes=") and ask.endswith("-") and ask[6:-1].isdigit():
                start = int(ask[6:-1])
                if start > st.st_size:
                    return self.send_error(416)
            self.send_response(206 if ask and start else 200)
            self.send_header("Content-Length", str(st.st_size - start))
            if ask and start:
                self.send_header("Content-Range", f"bytes {start}-{st.st_size - 1}/{st.st_size}")
            self.end_headers()
            self.wfile.flush()
            if st.st_size > start:
                self.connection.sendfile(f, start, st.st_size - start)


def notify_ready():
    """Tell systemd the server listens (its unit is Type=notify: sd_notify(3)'s READY=1 on $NOTIFY_SOCKET),
    so `systemctl restart` returns only once it answers: a worker's pull started right after the
    restart (a loaded head binds late) finds it answering, not refusing. Without the variable, nothing."""
    path = os.environ.get("NOTIFY_SOCKET", "")
    if not path:
        return
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.connect("\0" + path[1:] if path.startswith("@") else path)  # '@': an abstract socket
        s.sendall(b"READY=1")


def serve(a):
    Serve.root = os.path.realpath(a.dir)
    Serve.allowed = tuple(ipaddress.ip_network(c, strict=False) for c in a.allow)
    Serve.timeout = a.io_timeout or None  # a client that sends no request in this long is dropped
    server = http.server.ThreadingHTTPServer((a.address, a.port), Serve)  # bound and listening
    server.daemon_threads = True
    say(f"serving {Serve.root} read-only on {a.address}:{a.port} to {', '.join(a.allow)}")
    notify_ready()
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    server.serve_forever()
    server.server_close()


def pull(a):
    src = a.url.rstrip("/")
    if a.follow and not src.startswith("http://"):
        say("--follow needs the head's HTTP server (an http:// URL)")
        return 2
    job = (HttpPull if src.startswith("http://") else Pull)(src, a.dest, a)
    if threading.current_thread() is threading.main_thread():  # signal.signal's condition
        before = signal.signal(signal.SIGTERM, job.stop)
        try:
            return pulled(a, src, job)
        finally:
            signal.signal(signal.SIGTERM, before)
    return pulled(a, src, job)


def pulled(a, src, job):
    # The streams connect while the manifest crosses: a connection to an rsync daemon costs ~0.15 s of
    # handshakes whatever it carries; paid once here, not twice in a row.
    streams = job.launch()
    held = {}
    t0 = time.monotonic()
    try:
        if a.follow:
            text, held = follow(a, src, job)
        elif isinstance(job, HttpPull):
            text = http_text(src + ".manifest", a.io_timeout)
        else:
            with tempfile.TemporaryDirectory() as tmp:
                theirs = os.path.join(tmp, "manifest")
                rsync([src + ".manifest", theirs], a.io_timeout)
                with open(theirs) as f:
                    text = f.read()
        header, entries = checked_manifest(text, src + ".manifest")
        refuse_escapes(a.dest, entries, src + ".manifest")
        # What --follow pulled and verified against the landing list, where the manifest says the same:
        # in place already, not hashed again (this process installed or hashed each of them).
        job.verified = {rel for rel, sha in held.items() if rel in entries and entries[rel][1] == sha}
        check_disk(a.dest, missing_bytes(a.dest, entries), a.margin_gib)
        os.makedirs(a.dest, exist_ok=True)
        code = job.run(entries, streams)
    finally:
        job.release(streams)  # on a refusal: they end having transferred nothing
    seconds = time.monotonic() - t0
    total = sum(size for size, _ in entries.values())
    say(f"{len(job.verified)} of {len(entries)} files verified and in place, {total / GIB:.2f} GiB, "
        f"in {seconds:.1f} s ({total / max(seconds, 1e-9) / 2**20:.0f} MiB/s) over up to {a.streams} streams; "
        f"{job.crossed} bytes crossed the link")
    if job.problems:
        say(f"{a.dest} does not match the head's manifest:\n  " + "\n  ".join(sorted(job.problems)))
    if code:
        say(("the transfer failed" if isinstance(job, HttpPull) else f"rsync exited {code}")
            + "; a re-run resumes from what arrived")
    if job.problems:
        sys.exit(1)
    if code:
        sys.exit(code)
    missing = [f"missing {rel}" for rel in sorted(entries) if rel not in job.verified]
    if missing:  # rsync said it was done, yet a file never arrived: not a copy
        say(f"{a.dest} does not match the head's manifest:\n  " + "\n  ".join(missing))
        sys.exit(1)
    shutil.rmtree(job.stage, ignore_errors=True)
    write_atomic(a.manifest, text)  # verified equal: the head's manifest, byte for byte
    say(f"verified {len(entries)} files against the head's manifest; wrote {a.manifest}")


def main(argv):
    p = argparse.ArgumentParser(prog="sfl_files.py", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("manifest")
    m.add_argument("dir")
    m.add_argument("--header", action="append", default=[])
    s = sub.add_parser("seal")
    s.add_argument("dir")
    s.add_argument("--manifest", required=True)
    s.add_argument("--header", action="append", default=[])
    c = sub.add_parser("scrub")
    c.add_argument("dir")
    c.add_argument("--dry-run", action="store_true")
    v = sub.add_parser("verify")
    v.add_argument("dir")
    v.add_argument("manifest")
    for name, first in (("fetch-http", "url"), ("fetch-dir", "src")):
        f = sub.add_parser(name)
        f.add_argument(first)
        f.add_argument("dest")
        f.add_argument("--manifest", required=True)
        f.add_argument("--header", action="append", default=[])
        f.add_argument("--margin-gib", type=float, default=0.0)
        if name == "fetch-dir":
            f.add_argument("--io-timeout", type=int, default=0)
    h = sub.add_parser("fetch-hub")
    h.add_argument("repo")
    h.add_argument("revision")
    h.add_argument("dest")
    h.add_argument("--margin-gib", type=float, default=0.0)
    u = sub.add_parser("pull")
    u.add_argument("url")
    u.add_argument("dest")
    u.add_argument("--manifest", required=True)
    u.add_argument("--streams", type=int, default=STREAMS, choices=range(1, 65), metavar="N")
    u.add_argument("--bwlimit", type=int, default=0)
    u.add_argument("--margin-gib", type=float, default=0.0)
    u.add_argument("--io-timeout", type=int, default=0)
    u.add_argument("--follow", action="store_true")
    d = sub.add_parser("land")
    d.add_argument("dir")
    d.add_argument("--landed", required=True)
    d.add_argument("--interval", type=float, default=1.0)
    w = sub.add_parser("serve")
    w.add_argument("dir")
    w.add_argument("--address", required=True)
    w.add_argument("--port", type=int, required=True)
    w.add_argument("--allow", action="append", required=True, metavar="CIDR")
    w.add_argument("--io-timeout", type=int, default=600)
    command = []
    if argv[:1] == ["land"] and "--" in argv:  # land's COMMAND: everything after the first "--", verbatim
        at = argv.index("--")
        argv, command = argv[:at], argv[at + 1:]
    a = p.parse_args(argv)
    a.command = command
    if a.cmd == "manifest":
        sys.stdout.write(manifest_text(a.dir, a.header))
    elif a.cmd == "seal":
        finish(a.dir, a.manifest, a.header)
    elif a.cmd == "scrub":
        return scrub(a)
    elif a.cmd == "land":
        return land(a)
    elif a.cmd == "verify":
        with open(a.manifest) as f:
            problems = differences(a.dir, checked_manifest(f.read(), a.manifest)[1])
        for line in problems:
            print(line)
        return 1 if problems else 0
    else:
        return {"fetch-http": fetch_http, "fetch-dir": fetch_dir, "fetch-hub": fetch_hub, "pull": pull,
                "serve": serve}[a.cmd](a) or 0
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
