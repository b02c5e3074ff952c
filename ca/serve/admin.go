package serve

import (
	"log/slog"
	"net"
	"net/http"

	"github.com/meshca/meshca/ca/limit"
)

// Server labels of meshca_http_connections_*.
const (
	adminServer  = "admin"
	bundleServer = "bundle_endpoint"
)

// newAdmin is the admin port's server: h, which anyone who reaches lis
// may ask without credentials, under lim (zero fields: limit's
// defaults): its timeouts and header bound, and lis capped
// (limit.HTTPConns, counted in m). Its own errors (a connection it could
// not read) go to log at debug level.
func newAdmin(lis net.Listener, h http.Handler, lim limit.HTTPLimits, m *limit.HTTPConnMetrics, log *slog.Logger) (*http.Server, net.Listener) {
	log = log.With("part", adminServer)
	srv := lim.Server(h)
	srv.ErrorLog = slog.NewLogLogger(log.Handler(), slog.LevelDebug)
	conns := limit.NewHTTPConns(limit.HTTPConnsConfig{Server: adminServer, Limits: lim, Metrics: m, Logger: log})
	return srv, conns.Attach(srv, lis)
}
