package main

import (
	"strings"
	"testing"

	"github.com/meshca/meshca/ca/limit"
)

// TestServeAdminLimits: the admin port's caps come from the command line,
// the config file or MESHCA_ADMIN_* like every setting and reach
// serve.Config.Admin; 0 turns a cap off; a negative one is refused.
func TestServeAdminLimits(t *testing.T) {
	file := writeFile(t, "meshca.yaml", configHeader+"adminMaxConnections: 64\nadminMaxConnectionsPerPeer: 4\n")
	tests := []struct {
		name       string
		args, env  []string
		total, per int
		err        string
	}{
		{name: "defaults", total: 128, per: 16},
		{name: "flags", args: []string{"--admin-max-connections", "32", "--admin-max-connections-per-peer", "2"}, total: 32, per: 2},
		{name: "0: no limit", args: []string{"--admin-max-connections", "0", "--admin-max-connections-per-peer=0"}, total: limit.NoLimit, per: limit.NoLimit},
		{name: "config file", args: []string{"--config", file}, total: 64, per: 4},
		{name: "environment", env: []string{"MESHCA_ADMIN_MAX_CONNECTIONS=512"}, total: 512, per: 16},
		{name: "negative", args: []string{"--admin-max-connections-per-peer", "-1"}, err: "--admin-max-connections-per-peer (-1) must not be negative"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f, s, err := resolveServe(t, append([]string{"--state-dir", "/tmp/x"}, tt.args...), tt.env...)
			if err != nil {
				t.Fatal(err)
			}
			c, err := f.validate()
			if tt.err != "" {
				if err = s.explain(err); err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("err = %v, want %q", err, tt.err)
				}
				return
			}
			if err != nil || c.Admin.MaxConnections != tt.total || c.Admin.MaxConnectionsPerPeer != tt.per {
				t.Fatalf("Admin %+v, err %v; want %d total, %d a peer", c.Admin, err, tt.total, tt.per)
			}
		})
	}
}
