package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"sync"
	"syscall"

	"github.com/meshca/meshca/ca"
	"github.com/spf13/pflag"
)

// auditFileMode is the mode of an audit log file meshca creates; an
// existing file keeps its own.
const auditFileMode = 0o600

// auditFlags choose where audit events go.
type auditFlags struct {
	file string
}

func (a *auditFlags) register(fl *pflag.FlagSet, std string) {
	fl.StringVar(&a.file, "audit-log-file", "", "append audit events (one JSON object per line) to this file, created "+
		fmt.Sprintf("%#o", auditFileMode)+" and reopened on SIGHUP (for log rotation); empty: "+std)
}

// open returns the audit sink writing to the file, or to std, and the
// file (nil for std), which the caller closes.
func (a *auditFlags) open(std io.Writer) (*ca.AuditLog, *auditFile, error) {
	if a.file == "" {
		return ca.NewAuditLog(std), nil, nil
	}
	f, err := openAuditFile(a.file)
	if err != nil {
		return nil, nil, fmt.Errorf("--audit-log-file: %w", err)
	}
	return ca.NewAuditLog(f), f, nil
}

// auditFile is an audit log file opened for appending, which Reopen
// opens again at its path, so that logrotate can move it away and signal
// meshca (SIGHUP) to start a new one.
type auditFile struct {
	path string
	mu   sync.Mutex
	f    *os.File
}

func openAuditFile(path string) (*auditFile, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, auditFileMode)
	if err != nil {
		return nil, err
	}
	return &auditFile{path: path, f: f}, nil
}

// Write appends p, one event, in one write.
func (a *auditFile) Write(p []byte) (int, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.f.Write(p)
}

// Reopen opens the path again and closes the file it had; on an error the
// old file stays in use.
func (a *auditFile) Reopen() error {
	f, err := os.OpenFile(a.path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, auditFileMode)
	if err != nil {
		return err
	}
	a.mu.Lock()
	old := a.f
	a.f = f
	a.mu.Unlock()
	return old.Close()
}

// Close closes the file.
func (a *auditFile) Close() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.f.Close()
}

// reopenOnHangup reopens f on every SIGHUP until ctx ends.
func reopenOnHangup(ctx context.Context, f *auditFile, log *slog.Logger) {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	go func() {
		defer signal.Stop(hup)
		for {
			select {
			case <-ctx.Done():
				return
			case <-hup:
				if err := f.Reopen(); err != nil {
					log.Error("audit log not reopened; still writing to the old file", logPath, f.path, logError, err)
					continue
				}
				log.Info("audit log reopened", logPath, f.path)
			}
		}
	}()
}

// configEvent is the audit event of the effective configuration of fl:
// every setting's value, secrets redacted, and where it came from.
func configEvent(fl *pflag.FlagSet, s *settings) *ca.AuditEvent {
	e := &ca.AuditEvent{Event: ca.EventConfig, Decision: ca.DecisionLoaded, Version: version,
		ConfigFile: s.configFile, IgnoredEnv: s.ignoredEnv, Settings: map[string]ca.AuditSetting{}}
	fl.VisitAll(func(f *pflag.Flag) {
		if f.Name == "help" {
			return
		}
		var v any
		if sv, ok := f.Value.(pflag.SliceValue); ok {
			list := []string{}
			for _, x := range sv.GetSlice() {
				list = append(list, redact(f.Name, x))
			}
			v = list
		} else {
			v = typed(f.Value.Type(), redact(f.Name, f.Value.String()))
		}
		src := s.source[f.Name]
		if src == "" {
			src = sourceDefault
		}
		e.Settings[f.Name] = ca.AuditSetting{Value: v, Source: src}
	})
	return e
}

// typed is a flag's value as JSON shows it: booleans and numbers as
// such, anything else (durations too, "24h0m0s") as a string.
func typed(kind, v string) any {
	switch kind {
	case "bool":
		if b, err := strconv.ParseBool(v); err == nil {
			return b
		}
	case "int", "float64":
		if n, err := strconv.ParseFloat(v, 64); err == nil {
			return n
		}
	}
	return v
}
