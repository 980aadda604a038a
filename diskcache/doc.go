// Package diskcache is a node-local, content-addressed cache of VM disks
// fetched by URL (the vmshim.io/disk-url and vmshim.io/disk-sha256
// annotations). Each pod is its own shim process, so the cache is shared
// by processes that know nothing of each other: everything they agree on
// lives in the file system and in flock(2) locks.
//
// # Layout
//
// Inside Cache.Dir (made 0700 and owned by the shim's user, root):
//
//	sha256/<hex>         a final disk, mode 0444: the decompressed bytes of
//	                     the download whose sha256 is <hex>
//	tmp/<hex>.part       a download in progress; removed when it fails,
//	                     unless kept for a retry (see Downloads)
//	tmp/<hex>.unpack     a decompression in progress; removed when it fails
//	tmp/<hex>.reserve    the room reserved for <hex>'s temp files: a sparse
//	                     file whose apparent size is the bytes reserved
//	urls/<hex>           the URLs sha256/<hex> was fetched from: the
//	                     lowercase hex sha256 of each URL's string, one a
//	                     line, oldest first, at most 32 (never the URL,
//	                     which may hold a credential); written to
//	                     urls/<hex>.new and renamed, under the digest lock
//	locks/<hex>          the lock file of digest <hex> (empty)
//	locks/reserve        the lock that serialises reservations (empty)
//
// A urls file that is not a regular file, is over 4 KiB or does not
// parse counts as empty. It goes, before its disk, when Evict or Remove
// removes the disk, and a new download of a digest starts a new one.
//
// A final file only ever appears by rename(2) of a temp file that was
// verified, decompressed and fsynced, followed by an fsync of sha256/, so a
// crash never leaves an incomplete final file. Every file is opened with
// openat(2) on a directory descriptor and O_NOFOLLOW.
//
// # Locking
//
// The digest lock is an exclusive flock on locks/<hex>. Whoever holds it
// owns sha256/<hex> and tmp/<hex>.*: Get holds it while it checks,
// downloads, decompresses and opens the disk, and Evict holds it while it
// removes them. Other callers (other shims, or other Cache values in one
// process: each opens its own file description) poll for it every 50 ms
// until their own context ends, never longer: another's download cannot
// hold a create past its deadline, and the error says "another shim is
// downloading sha256:<hex>; waited <d>". The holder's download is itself
// bounded by its caller's context, DownloadTimeout and the stall watchdog.
// A lock file may be unlinked by its holder (Evict
// does), so a locker checks after flock that the path still names the inode
// it locked, and starts again if not. A lock dies with its holder: there is
// no stale state to clean after a crash.
//
// # In use
//
// The file of a Disk holds a shared flock (LOCK_SH) on its own open file
// description. Descriptors dup'ed from it, such as the one QEMU inherits,
// share that description and so the lock: the disk is in use until the last
// of them is closed, whoever holds it. Evict takes LOCK_EX|LOCK_NB on a
// disk before removing it and skips it when that fails. Get opens a final
// file without the digest lock when it exists, takes LOCK_SH, and then
// checks that sha256/<hex> still names the inode it opened (else Evict won
// the race, and Get takes the slow path under the digest lock).
//
// # Room and eviction
//
// What the cache holds is the apparent sizes of the disks in sha256/ plus,
// for each digest with temp files, the larger of what they hold and what
// it has reserved. A download reserves room before it writes a byte: its
// Content-Length once the response's headers arrive (a body of unknown size
// and a decompression of unknown size grow the reservation in chunks ahead
// of what they write; xz gives its size up front). To reserve, a shim takes
// locks/reserve, removes the stale temp files, then evicts until the
// reservation fits in MaxSize, and refuses in one line naming
// cache_max_size when it cannot. Since every reservation is made under
// that lock and counted by all, concurrent downloads never together
// overshoot MaxSize. A reservation dies with its digest lock: one whose
// lock nobody holds is stale.
//
// Get sets a disk's mtime to now each time it returns it, so the mtime is
// its last use. Eviction removes the oldest first, skipping the disk just
// returned, those in use and those whose digest lock is held; temp files
// whose digest lock nobody holds were left by a process that died, and
// are removed whatever the cache holds, but for kept partial downloads:
// those count as their size and are evicted, oldest first, like disks.
// Get also evicts after it added a disk.
//
// # Whose network
//
// Downloads, and the one-byte request that must succeed before a disk
// already in the cache is returned, go through Cache.Client. A disk in the
// cache is returned for a URL only when the URL is in its urls file (read
// without the digest lock: it is only ever replaced whole, by rename) and
// answers that request. For any other URL, Get takes the digest lock and
// the Client downloads it in full into tmp/, as any download; only when
// its sha256 is the digest is the URL added and the cached disk returned
// (the download is removed), so knowing a digest without its bytes gets
// a pod nothing. The shim
// gives each pod a client from NewPodClient, whose connections are all
// made from the pod's network namespace (Netns) with the pod's DNS and
// never to a denied address, so a pod gets no disk its own network could
// not fetch.
//
// # Downloads
//
// The digest is the sha256 of the bytes the URL serves (the compressed
// file, if it is compressed), checked before anything else reads them. A
// dropped connection is resumed with a Range request (and If-Range when
// the server gave a validator) within the same Get. A Get that fails
// removes its temp files, so nothing of a failed download stays, with one
// exception: when the caller's context ended (a deadline such as the
// kubelet's, or a cancel; not download_timeout, nor any other failure)
// while the download was progressing, at 1 MiB/s or more on average since
// this Get took the digest lock, tmp/<hex>.part is kept (its reservation and .unpack go)
// and the next Get of the digest resumes it with a Range request. A lone
// .part whose digest lock is free is such a kept download; at most 4 are
// kept (the oldest beyond are removed), each for an hour after its last
// write, and they count against MaxSize. A download left by a process
// that died is hashed and resumed by the next Get of its digest; with its
// reservation it is removed by the next Get that downloads another or by
// Evict. A download is at most MaxDownload bytes (and MaxDisk), by its
// Content-Length before the body is read and by what it sends. The
// verified download is decompressed by its magic bytes (gzip, xz, zstd)
// with the output capped at MaxDisk and at MaxRatio times the download,
// and decoder memory bounded (xz dictionaries and zstd windows of at most
// 128 MiB); any other file is kept as it is. Every refusal is one line
// that names the config key of its limit.
package diskcache
