package main

import (
	"log/slog"
	"runtime/debug"
	"strings"
	"testing"
)

func TestMemoryLimit(t *testing.T) {
	tests := []struct {
		value string
		want  int64
		err   string
	}{
		{value: "", want: 0},
		{value: "256Mi", want: 256 << 20 * 9 / 10},
		{value: "268435456", want: 268435456 * 9 / 10}, // the downward API gives bytes
		{value: "1G", want: 900_000_000},
		{value: "15Mi", err: `--memory-limit "15Mi": want at least 16Mi`},
		{value: "100m", err: `--memory-limit "100m": want a whole number of bytes`},
		{value: "lots", err: `--memory-limit "lots": want bytes or a quantity such as 256Mi`},
	}
	for _, tt := range tests {
		t.Run(tt.value, func(t *testing.T) {
			m := memoryLimitFlag{value: tt.value}
			got, err := m.softLimit()
			if tt.err != "" {
				if err == nil || !strings.HasPrefix(err.Error(), tt.err) {
					t.Fatalf("softLimit() = %d, %v; want error %q", got, err, tt.err)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("softLimit() = %d, %v; want %d", got, err, tt.want)
			}
		})
	}
}

// TestMemoryLimitApply: the runtime's limit is set, unless GOMEMLIMIT
// is, which wins.
func TestMemoryLimitApply(t *testing.T) {
	before := debug.SetMemoryLimit(-1)
	t.Cleanup(func() { debug.SetMemoryLimit(before) })
	m := memoryLimitFlag{value: "100Mi"}

	t.Setenv("GOMEMLIMIT", "")
	if err := m.apply(slog.New(slog.DiscardHandler)); err != nil {
		t.Fatal(err)
	}
	if got, want := debug.SetMemoryLimit(-1), int64(100<<20*9/10); got != want {
		t.Fatalf("soft limit %d, want %d", got, want)
	}
	debug.SetMemoryLimit(before)
	t.Setenv("GOMEMLIMIT", "50MiB")
	if err := m.apply(slog.New(slog.DiscardHandler)); err != nil {
		t.Fatal(err)
	}
	if got := debug.SetMemoryLimit(-1); got != before {
		t.Fatalf("soft limit %d with GOMEMLIMIT set, want it left at %d", got, before)
	}
}
