// Command meshca is a certificate authority for Istio service meshes: it
// serves the Istio CA API to ztunnel and istio-agent.
package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/spf13/cobra"
	"k8s.io/klog/v2"
)

func main() {
	// client-go logs through klog; in its own format its lines would sit
	// among meshca's slog lines. serve routes it to its logger in turn.
	klog.SetSlogLogger(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := newRootCommand().ExecuteContext(ctx)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "meshca:", err)
		os.Exit(exitCode(err))
	}
}

func newRootCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:           "meshca",
		Short:         "Certificate authority and workload identity for Istio service meshes",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	cmd.AddCommand(newServeCommand(), newIssueCommand(), newExplainCommand(), newRootCACommand(), newRevokeCommand(), newVersionCommand())
	return cmd
}

// logFlags configure the process logger.
type logFlags struct {
	format string
	level  string
}

func (l *logFlags) register(cmd *cobra.Command) {
	cmd.Flags().StringVar(&l.format, "log-format", "json", "log format: json or text")
	cmd.Flags().StringVar(&l.level, "log-level", "info", "log level: debug, info, warn or error")
}

func (l *logFlags) logger() (*slog.Logger, error) {
	var level slog.Level
	if err := level.UnmarshalText([]byte(l.level)); err != nil {
		return nil, fmt.Errorf("--log-level: %w", err)
	}
	opts := &slog.HandlerOptions{Level: level}
	switch strings.ToLower(l.format) {
	case "json":
		return slog.New(slog.NewJSONHandler(os.Stderr, opts)), nil
	case "text":
		return slog.New(slog.NewTextHandler(os.Stderr, opts)), nil
	}
	return nil, fmt.Errorf("--log-format: %q is neither json nor text", l.format)
}
