package rootdisk

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
)

// StateName is a VM's saved state (its RAM and devices, QEMU's migration
// stream) kept on a filesystem volume beside the root disk by a suspend,
// until the next container resumes it. It is written as stateTemp and
// renamed once whole, so a save cut short is never found under this
// name; it is removed before the state is loaded, so it is resumed once.
const StateName = "vmshim-state"

const stateTemp = StateName + ".part"

// The state file opens with a header block of stateHeaderSize bytes:
// stateMagic, the length of the JSON header as a big-endian uint32, the
// JSON header, and spaces up to the block's end. QEMU's stream follows.
const (
	stateMagic      = "VMSHIM-STATE-1\n\x00"
	stateHeaderSize = 4096
	maxStateJSON    = stateHeaderSize - len(stateMagic) - 4
)

// StateInfo is what a state was saved from, for the container that
// would resume it to compare with its own VM.
type StateInfo struct {
	QEMU      string    `json:"qemu"` // QEMU's version
	Machine   string    `json:"machine"`
	Firmware  string    `json:"firmware"`
	VCPUs     int       `json:"vcpus"`         // the vCPUs the container asked for
	Plugged   int       `json:"plugged_vcpus"` // the vCPUs QEMU has, online or not
	MaxVCPUs  int       `json:"max_vcpus"`     // the vCPUs QEMU has room for
	MemoryMiB int       `json:"memory_mib"`    // guest RAM outside virtio-mem
	ResizeMiB int       `json:"resize_mib"`    // the virtio-mem region
	Balloon   bool      `json:"balloon"`       // a virtio-balloon device
	TPM       bool      `json:"tpm,omitempty"` // a TPM, whose state the stream holds
	MACs      []string  `json:"macs"`          // the guest NICs', in order
	Saved     time.Time `json:"saved"`
	// Stream is the length of QEMU's stream after the header block: a
	// file of another size was cut short, or added to.
	Stream int64 `json:"stream"`
	// Disk is the root disk as the save left it: a disk changed since
	// (a boot, a new disk) does not go with the state.
	Disk DiskStamp `json:"disk"`
}

// DiskStamp tells a root disk file apart from what it was.
type DiskStamp struct {
	Size    int64  `json:"size"`
	MtimeNS int64  `json:"mtime_ns"`
	Ino     uint64 `json:"ino"`
}

// stampOf is f's DiskStamp.
func stampOf(f *os.File) (DiskStamp, error) {
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return DiskStamp{}, err
	}
	return DiskStamp{Size: st.Size, MtimeNS: st.Mtim.Nano(), Ino: st.Ino}, nil
}

// parseStateHeader reads a header block; any block it cannot read is an
// error that says why, in one line.
func parseStateHeader(b []byte) (StateInfo, error) {
	var info StateInfo
	if len(b) < stateHeaderSize {
		return info, fmt.Errorf("cut short (%d bytes, under the %d of its header)", len(b), stateHeaderSize)
	}
	if !bytes.HasPrefix(b, []byte(stateMagic)) {
		return info, errors.New("not a vmshim state of this version")
	}
	n := binary.BigEndian.Uint32(b[len(stateMagic):])
	if n == 0 || n > uint32(maxStateJSON) {
		return info, fmt.Errorf("header of %d bytes", n)
	}
	body := b[len(stateMagic)+4 : len(stateMagic)+4+int(n)]
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&info); err != nil {
		return StateInfo{}, fmt.Errorf("header: %w", err)
	}
	if info.VCPUs < 1 || info.MemoryMiB < 1 || len(info.MACs) > 64 || info.Stream < 1 {
		return StateInfo{}, fmt.Errorf("header: %d vCPUs, %d MiB, %d NICs, a stream of %d bytes", info.VCPUs, info.MemoryMiB, len(info.MACs), info.Stream)
	}
	return info, nil
}

// stateHeader is info's header block.
func stateHeader(info StateInfo) ([]byte, error) {
	body, err := json.Marshal(info)
	if err != nil {
		return nil, err
	}
	if len(body) > maxStateJSON {
		return nil, fmt.Errorf("state header of %d bytes, more than %d", len(body), maxStateJSON)
	}
	b := bytes.Repeat([]byte{' '}, stateHeaderSize)
	copy(b, stateMagic)
	binary.BigEndian.PutUint32(b[len(stateMagic):], uint32(len(body)))
	copy(b[len(stateMagic)+4:], body)
	return b, nil
}

// stateVolume opens the filesystem volume in dir for its state, and
// removes a state a crash cut short: it is never resumed.
func stateVolume(dir, name string) (volume, error) {
	v, err := openVolume(dir, name)
	if err != nil {
		return volume{}, err
	}
	_ = unix.Unlinkat(int(v.dir.Fd()), stateTemp, 0)
	return v, nil
}

// SavingState is a state being written on a volume, or into a
// checkpoint.
type SavingState struct {
	// File is where QEMU writes its stream, positioned after the header.
	File *os.File
	v    volume  // where the state goes
	disk *volume // the root disk's volume, when it is not v
}

// CreateState starts a state on the filesystem volume in dir (name is
// the volume as the container sees it): stateTemp, made anew, its header
// block reserved. Call it with the root disk claimed.
func CreateState(dir, name string) (*SavingState, error) {
	return createState(dir, nil, name)
}

// CreateCheckpoint starts a state in the directory into (a checkpoint
// of containerd's), of the VM whose root disk is on the filesystem
// volume in dir: the state goes with that disk as the save leaves it,
// as one on the volume does. OpenState(into, …) opens it.
func CreateCheckpoint(into, dir, name string) (_ *SavingState, retErr error) {
	v, err := openVolume(dir, name)
	if err != nil {
		return nil, err
	}
	s, err := createState(into, &v, name)
	if err != nil {
		v.dir.Close()
	}
	return s, err
}

func createState(dir string, disk *volume, name string) (_ *SavingState, retErr error) {
	v, err := stateVolume(dir, name)
	if err != nil {
		return nil, err
	}
	defer func() {
		if retErr != nil {
			v.dir.Close()
		}
	}()
	d := v.dir
	f, err := v.open(stateTemp, unix.O_RDWR|unix.O_CREAT)
	if err != nil {
		return nil, err
	}
	if _, err := f.Seek(stateHeaderSize, io.SeekStart); err != nil {
		f.Close()
		_ = unix.Unlinkat(int(d.Fd()), stateTemp, 0)
		return nil, fmt.Errorf("root disk volume %s: %w", name, err)
	}
	return &SavingState{File: f, v: v, disk: disk}, nil
}

// close lets go of the directories.
func (s *SavingState) close() {
	s.v.dir.Close()
	if s.disk != nil {
		s.disk.dir.Close()
	}
}

// Commit writes info's header, with the stamp of the volume's root disk,
// flushes the state and gives it its name; it returns the state's size.
// Call it once QEMU has written its stream and ended, so that the disk
// is as the state leaves it.
func (s *SavingState) Commit(info StateInfo) (int64, error) {
	fail := func(err error) (int64, error) {
		s.Abort()
		return 0, fmt.Errorf("root disk volume %s: save state: %w", s.v.name, err)
	}
	dv := s.v
	if s.disk != nil {
		dv = *s.disk
	}
	disk, err := dv.open(DiskName, unix.O_RDONLY)
	if err != nil {
		return fail(err)
	}
	info.Disk, err = stampOf(disk)
	disk.Close()
	if err != nil {
		return fail(err)
	}
	size, err := s.File.Seek(0, io.SeekCurrent)
	if err != nil {
		return fail(err)
	}
	info.Stream = size - stateHeaderSize
	h, err := stateHeader(info)
	if err != nil {
		return fail(err)
	}
	if _, err := s.File.WriteAt(h, 0); err != nil {
		return fail(err)
	}
	if err := s.File.Sync(); err != nil {
		return fail(err)
	}
	if err := unix.Renameat(int(s.v.dir.Fd()), stateTemp, int(s.v.dir.Fd()), StateName); err != nil {
		return fail(err)
	}
	if err := s.v.dir.Sync(); err != nil {
		return fail(err)
	}
	s.File.Close()
	s.close()
	return size, nil
}

// Abort removes the state being written.
func (s *SavingState) Abort() {
	s.File.Close()
	_ = unix.Unlinkat(int(s.v.dir.Fd()), stateTemp, 0)
	_ = s.v.dir.Sync()
	s.close()
}

// SavedState is a state found on a volume, open, not yet taken.
type SavedState struct {
	Info StateInfo
	// File is the state, positioned at QEMU's stream.
	File *os.File
	v    volume
}

// OpenState opens the state saved on the filesystem volume in dir, nil
// when there is none. A state cut short by a crash (stateTemp) is
// removed. A state whose header does not parse is an error.
func OpenState(dir, name string) (_ *SavedState, retErr error) {
	v, err := stateVolume(dir, name)
	if err != nil {
		return nil, err
	}
	defer func() {
		if retErr != nil {
			v.dir.Close()
		}
	}()
	d := v.dir
	f, err := v.open(StateName, unix.O_RDONLY)
	if errors.Is(err, os.ErrNotExist) {
		d.Close()
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	b := make([]byte, stateHeaderSize)
	n, err := io.ReadFull(f, b)
	if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, io.EOF) {
		f.Close()
		return nil, fmt.Errorf("root disk volume %s: read %s: %w", name, StateName, err)
	}
	info, err := parseStateHeader(b[:n])
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("root disk volume %s: saved state %s: %v: %w", name, StateName, err, errdefs.ErrInvalidArgument)
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		f.Close()
		return nil, fmt.Errorf("root disk volume %s: %w", name, err)
	}
	if want := stateHeaderSize + info.Stream; st.Size != want {
		f.Close()
		return nil, fmt.Errorf("root disk volume %s: saved state %s holds %d bytes, and its header says %d: it was cut short or changed: %w",
			name, StateName, st.Size, want, errdefs.ErrInvalidArgument)
	}
	return &SavedState{Info: info, File: f, v: v}, nil
}

// RemoveState removes the state saved on the filesystem volume in dir,
// and one cut short, if there are any: a state that will not be resumed.
func RemoveState(dir, name string) error {
	v, err := stateVolume(dir, name)
	if err != nil {
		return err
	}
	defer v.dir.Close()
	if err := unix.Unlinkat(int(v.dir.Fd()), StateName, 0); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("root disk volume %s: remove the saved state: %w", name, err)
	}
	if err := v.dir.Sync(); err != nil {
		return fmt.Errorf("root disk volume %s: %w", name, err)
	}
	return nil
}

// CheckDisk refuses a state that does not go with the volume's disk as
// it is now: changed since the save, or another disk.
func (s *SavedState) CheckDisk(disk *os.File) error {
	now, err := stampOf(disk)
	if err != nil {
		return fmt.Errorf("root disk volume %s: %w", s.v.name, err)
	}
	if now != s.Info.Disk {
		return fmt.Errorf("root disk volume %s: the saved state does not go with the root disk, which changed after the save (%d bytes, modified %s; saved with %d bytes, modified %s): %w",
			s.v.name, now.Size, time.Unix(0, now.MtimeNS).UTC().Format(time.RFC3339Nano),
			s.Info.Disk.Size, time.Unix(0, s.Info.Disk.MtimeNS).UTC().Format(time.RFC3339Nano), errdefs.ErrFailedPrecondition)
	}
	return nil
}

// Take removes the state's name from the volume, so that it is never
// resumed again; File stays readable. Only the file OpenState opened is
// removed: one put there since is left.
func (s *SavedState) Take() error {
	var opened, named unix.Stat_t
	if err := unix.Fstat(int(s.File.Fd()), &opened); err != nil {
		return fmt.Errorf("root disk volume %s: %w", s.v.name, err)
	}
	if err := unix.Fstatat(int(s.v.dir.Fd()), StateName, &named, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("root disk volume %s: take the saved state: %w", s.v.name, err)
	}
	if opened.Dev != named.Dev || opened.Ino != named.Ino {
		return fmt.Errorf("root disk volume %s: the saved state was replaced while it was read: %w", s.v.name, errdefs.ErrUnavailable)
	}
	if err := unix.Unlinkat(int(s.v.dir.Fd()), StateName, 0); err != nil {
		return fmt.Errorf("root disk volume %s: take the saved state: %w", s.v.name, err)
	}
	if err := s.v.dir.Sync(); err != nil {
		return fmt.Errorf("root disk volume %s: %w", s.v.name, err)
	}
	return nil
}

// Close closes the state.
func (s *SavedState) Close() {
	s.File.Close()
	s.v.dir.Close()
}
