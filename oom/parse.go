package oom

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
)

// maxFileSize bounds what is read of a counter file; the kernel's are a
// few hundred bytes.
const maxFileSize = 4096

// excerptSize bounds how much of a bad line an error quotes.
const excerptSize = 64

// readFile reads all of the open cgroup file f from its start; when f is
// too large it returns the start with the error.
func readFile(f *os.File) ([]byte, error) {
	buf := make([]byte, maxFileSize+1)
	n, err := f.ReadAt(buf, 0)
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, err
	}
	if n > maxFileSize {
		return buf[:maxFileSize], fmt.Errorf("%s is larger than %d bytes", f.Name(), maxFileSize)
	}
	return buf[:n], nil
}

// parseCounter returns the value of key in the flat keyed content of a
// cgroup file such as memory.events or memory.oom_control (lines "key
// value"), and whether key is there. Other lines are not checked; a key
// line without exactly one decimal value, or a key given twice, is an
// error.
func parseCounter(data []byte, key string) (uint64, bool, error) {
	var (
		value uint64
		found bool
	)
	for line := range bytes.SplitSeq(data, []byte("\n")) {
		fields := bytes.Fields(line)
		if len(fields) == 0 || string(fields[0]) != key {
			continue
		}
		if found {
			return 0, false, fmt.Errorf("counter %s appears more than once", key)
		}
		if len(fields) != 2 {
			return 0, false, fmt.Errorf("counter line %q: want %s and one number", excerpt(line), key)
		}
		n, err := strconv.ParseUint(string(fields[1]), 10, 64)
		if numErr := (*strconv.NumError)(nil); errors.As(err, &numErr) {
			err = numErr.Err
		}
		if err != nil {
			return 0, false, fmt.Errorf("counter line %q: %w", excerpt(line), err)
		}
		value, found = n, true
	}
	return value, found, nil
}

// readCounter reads key from the open cgroup file f; data is what was
// read, for the test hook.
func readCounter(f *os.File, key string) (n uint64, found bool, data []byte, err error) {
	data, err = readFile(f)
	if err != nil {
		return 0, false, data, err
	}
	n, found, err = parseCounter(data, key)
	if err != nil {
		return 0, false, data, fmt.Errorf("parse %s: %w", f.Name(), err)
	}
	return n, found, data, nil
}

// excerpt returns the start of b, short enough to quote in an error.
func excerpt(b []byte) []byte {
	if len(b) > excerptSize {
		return b[:excerptSize]
	}
	return b
}
