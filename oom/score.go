package oom

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// SetScoreAdj gives process pid the oom_score_adj adj (a spec's
// process.oomScoreAdj, the kubelet's per-QoS value); with none (nil) it
// keeps the one it inherited, as a runc container does.
func SetScoreAdj(pid int, adj *int) error {
	if adj == nil {
		return nil
	}
	if err := os.WriteFile(scoreAdjFile(pid), []byte(strconv.Itoa(*adj)), 0); err != nil {
		return fmt.Errorf("set oom_score_adj %d of pid %d: %w", *adj, pid, err)
	}
	return nil
}

// RaiseScoreAdj raises the oom_score_adj of pid to adj when adj is above
// it; it never lowers it (which needs CAP_SYS_RESOURCE). A pod's shim
// raises its own to each of its tasks' so that the node's OOM killer
// does not spare it over its pod.
func RaiseScoreAdj(pid int, adj *int) error {
	if adj == nil {
		return nil
	}
	file := scoreAdjFile(pid)
	data, err := os.ReadFile(file)
	if err != nil {
		return fmt.Errorf("read oom_score_adj of pid %d: %w", pid, err)
	}
	current, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil {
		return fmt.Errorf("read oom_score_adj of pid %d: %w", pid, err)
	}
	if *adj <= current {
		return nil
	}
	if err := os.WriteFile(file, []byte(strconv.Itoa(*adj)), 0); err != nil {
		return fmt.Errorf("raise oom_score_adj of pid %d from %d to %d: %w", pid, current, *adj, err)
	}
	return nil
}

func scoreAdjFile(pid int) string { return fmt.Sprintf("/proc/%d/oom_score_adj", pid) }
