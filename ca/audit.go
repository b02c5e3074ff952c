package ca

import (
	"context"
	"log/slog"
	"time"

	"google.golang.org/grpc/codes"
)

// finish records the one audit event and the metrics of a request and
// returns the status the client receives. The detail of a refusal is
// logged, never sent; tokens and keys never reach either.
func (s *Server) finish(ctx context.Context, r *request, err error, start time.Time) error {
	o := classify(err)
	elapsed := s.c.Now().Sub(start)
	s.c.Metrics.observe(o, elapsed)
	attrs := []slog.Attr{
		slog.Bool(logAudit, true),
		slog.String(logCode, o.Code.String()),
		slog.String(logReason, o.Reason),
		slog.String(logBackend, s.c.SignerName),
		slog.Duration(logLatency, elapsed),
	}
	if r.peer != "" {
		attrs = append(attrs, slog.String(logPeer, r.peer))
	}
	if r.creds.ClusterID != "" {
		attrs = append(attrs, slog.String(logCluster, r.creds.ClusterID))
	}
	if c := r.caller; c != nil {
		attrs = append(attrs, slog.String(logCaller, c.ID.String()), slog.String(logMethod, c.Method))
		if c.PodName != "" {
			attrs = append(attrs, slog.String(logPod, c.Namespace+"/"+c.PodName))
		}
		if c.Node != "" {
			attrs = append(attrs, slog.String(logNode, c.Node))
		}
	}
	if r.requested != "" {
		attrs = append(attrs, slog.String(logRequested, r.requested))
	}
	if !r.identity.IsZero() {
		attrs = append(attrs, slog.String(logIdentity, r.identity.String()))
	}
	level := slog.LevelInfo
	if o.Code != codes.OK {
		level = slog.LevelWarn
		attrs = append(attrs, slog.String(logDetail, o.Detail))
	}
	if r.leaf != nil {
		attrs = append(attrs, slog.String(logSerial, r.leaf.SerialNumber.Text(16)),
			slog.Time(logNotAfter, r.leaf.NotAfter))
	}
	s.c.Logger.LogAttrs(ctx, level, "certificate request", attrs...)
	return o.Status()
}
