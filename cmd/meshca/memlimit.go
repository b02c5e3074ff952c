package main

import (
	"fmt"
	"log/slog"
	"os"
	"runtime/debug"

	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/api/resource"
)

// memoryLimitShare is the part of the container's memory limit the Go
// heap may grow to before the collector works harder: the rest is for
// the goroutine stacks, the binary and what the runtime has not yet
// returned.
const memoryLimitShare = 0.9

// memoryLimitFlag is --memory-limit: the container's memory limit, from
// which meshca sets the Go runtime's soft memory limit.
type memoryLimitFlag struct{ value string }

func (m *memoryLimitFlag) register(fl *pflag.FlagSet) {
	fl.StringVar(&m.value, "memory-limit", "", fmt.Sprintf(
		"the container's memory limit, in bytes or as a Kubernetes quantity (the downward API's limits.memory, as the chart passes it): the Go runtime's soft memory limit is set to %.0f%% of it, so that garbage is collected before the kernel's limit kills meshca; GOMEMLIMIT, when set, wins; empty: no soft limit",
		memoryLimitShare*100))
}

// softLimit is the soft memory limit --memory-limit asks for, 0 for none.
func (m *memoryLimitFlag) softLimit() (int64, error) {
	if m.value == "" {
		return 0, nil
	}
	q, err := resource.ParseQuantity(m.value)
	if err != nil {
		return 0, fmt.Errorf("--memory-limit %q: want bytes or a quantity such as 256Mi: %w", m.value, err)
	}
	b, ok := q.AsInt64()
	switch {
	case !ok:
		return 0, fmt.Errorf("--memory-limit %q: want a whole number of bytes", m.value)
	case b < 16<<20:
		return 0, fmt.Errorf("--memory-limit %q: want at least 16Mi", m.value)
	}
	return int64(float64(b) * memoryLimitShare), nil
}

// apply sets the runtime's soft memory limit, unless GOMEMLIMIT is set.
func (m *memoryLimitFlag) apply(log *slog.Logger) error {
	limit, err := m.softLimit()
	if err != nil || limit == 0 {
		return err
	}
	if v := os.Getenv("GOMEMLIMIT"); v != "" {
		log.Info("GOMEMLIMIT is set; --memory-limit left unused", logGoMemLimit, v, logMemoryLimit, m.value)
		return nil
	}
	debug.SetMemoryLimit(limit)
	log.Info("Go soft memory limit set", logMemoryLimit, m.value, logSoftLimit, limit)
	return nil
}
