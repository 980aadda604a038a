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
//	tmp/<hex>.part       a download in progress or interrupted; resumed by
//	                     the next Get of <hex>
//	tmp/<hex>.unpack     a decompression in progress
//	locks/<hex>          the lock file of digest <hex> (empty)
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
// until their context ends. A lock file may be unlinked by its holder (Evict
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
// # Eviction
//
// Get sets a disk's mtime to now each time it returns it, so the mtime is
// its last use. When a Get added a disk and the files in sha256/ and tmp/
// hold more than MaxSize bytes (apparent sizes), the oldest are removed first until they fit,
// skipping the disk just returned, those in use and those whose digest lock
// is held. Temp files whose digest lock nobody holds are stale and count
// like disks.
//
// # Whose network
//
// Downloads, and the one-byte request that must succeed before a disk
// already in the cache is returned, go through Cache.Client. The shim
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
// the server gave a validator); an interrupted download left by a process
// that died is hashed and resumed by the next Get. The verified download is
// decompressed by its magic bytes (gzip, xz, zstd) with the output capped at
// MaxDisk and decoder memory bounded (xz dictionaries and zstd windows of at
// most 128 MiB); any other file is kept as it is.
package diskcache
