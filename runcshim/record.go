package runcshim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	taskAPI "github.com/containerd/containerd/api/runtime/task/v3"
	"github.com/containerd/errdefs/pkg/errgrpc"
	"github.com/containerd/log"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"google.golang.org/protobuf/proto"
)

// RecordFile is the file in an ordinary container's bundle that says the
// container runs under the pod's runc shim, and where that shim serves:
// written before the container is created, removed once it is deleted.
const RecordFile = "vmshim-runc.json"

// Record is what the delete action needs of an ordinary container.
type Record struct {
	ID      string `json:"id"`
	Address string `json:"address"` // the runc shim's ttrpc address
}

// WriteRecord writes rec into bundle.
func WriteRecord(bundle string, rec Record) error {
	data, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	tmp := filepath.Join(bundle, "."+RecordFile)
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return fmt.Errorf("write runc record: %w", err)
	}
	if err := os.Rename(tmp, filepath.Join(bundle, RecordFile)); err != nil {
		return fmt.Errorf("write runc record: %w", err)
	}
	return nil
}

// ReadRecord reads the record in bundle; nil when there is none (the
// container is no ordinary one, or never got as far as its create).
func ReadRecord(bundle string) (*Record, error) {
	data, err := os.ReadFile(filepath.Join(bundle, RecordFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read runc record: %w", err)
	}
	var rec Record
	if err := json.Unmarshal(data, &rec); err != nil {
		return nil, fmt.Errorf("parse runc record in %s: %w", bundle, err)
	}
	return &rec, nil
}

// RemoveRecord removes the record in bundle.
func RemoveRecord(bundle string) error {
	if err := os.Remove(filepath.Join(bundle, RecordFile)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove runc record: %w", err)
	}
	return nil
}

// Cleanup is the delete action's part for an ordinary container whose VM
// shim is gone: the runc shim that runs it, if it still answers, deletes
// it (killing its processes first) and is asked to end; if it does not,
// its binary's delete action removes the container, as containerd would
// run it. It returns the container's exit as the runc shim reports it.
func Cleanup(ctx context.Context, cfg Config, ns, bundle string, rec *Record) (*taskAPI.DeleteResponse, error) {
	if s, err := Dial(ctx, rec.Address); err == nil {
		defer s.Close()
		resp, err := deleteLive(ctx, s, rec.ID)
		if err == nil {
			_, _ = s.task.Shutdown(ctx, &taskAPI.ShutdownRequest{})
			return resp, RemoveRecord(bundle)
		}
		log.G(ctx).WithError(err).WithField("id", rec.ID).Warn("runc shim did not delete the container; running its delete action")
	}
	bin, err := cfg.binary()
	if err != nil {
		return nil, err
	}
	cfg.Binary = bin
	ctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	cmd := cfg.command(ctx, ns, rec.ID, bundle, "delete")
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("runc shim delete action for %s: %w", rec.ID, err)
	}
	var resp taskAPI.DeleteResponse
	if err := proto.Unmarshal(out, &resp); err != nil {
		return nil, fmt.Errorf("runc shim delete action for %s: unreadable answer: %w", rec.ID, err)
	}
	return &resp, RemoveRecord(bundle)
}

// deleteLive kills and deletes container id through a runc shim that
// still serves it.
func deleteLive(ctx context.Context, s *Shim, id string) (*taskAPI.DeleteResponse, error) {
	_, _ = s.task.Kill(ctx, &taskAPI.KillRequest{ID: id, Signal: 9, All: true})
	if _, err := s.task.Wait(ctx, &taskAPI.WaitRequest{ID: id}); err != nil {
		return nil, errgrpc.ToNative(err)
	}
	resp, err := s.task.Delete(ctx, &taskAPI.DeleteRequest{ID: id})
	return resp, errgrpc.ToNative(err)
}

// cgroupsPath is the cgroups path of the spec in bundle.
func cgroupsPath(bundle string) (string, error) {
	data, err := os.ReadFile(filepath.Join(bundle, "config.json"))
	if err != nil {
		return "", err
	}
	var spec specs.Spec
	if err := json.Unmarshal(data, &spec); err != nil {
		return "", err
	}
	if spec.Linux == nil {
		return "", nil
	}
	return spec.Linux.CgroupsPath, nil
}
