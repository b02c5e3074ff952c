package main

import (
	"context"
	"strings"
	"testing"
	"time"
)

func TestResolve(t *testing.T) {
	given := options{Root: "../..", Version: "v1.2.3-4-gabcdef0-dirty", Revision: "abc", Epoch: "1700000000",
		Arch: "arm64", Repository: "ghcr.io/meshca/meshca", Source: "https://github.com/meshca/meshca"}
	with := func(f func(*options)) options { o := given; f(&o); return o }
	tests := []struct {
		name    string
		opts    options
		wantRef string
		wantErr string
	}{
		{name: "everything given", opts: given, wantRef: "ghcr.io/meshca/meshca:v1.2.3-4-gabcdef0-dirty"},
		{name: "build metadata", opts: with(func(o *options) { o.Version = "v1.2.3+meta" }), wantRef: "ghcr.io/meshca/meshca:v1.2.3-meta"},
		{name: "long version", opts: with(func(o *options) { o.Version = strings.Repeat("v", 200) }),
			wantRef: "ghcr.io/meshca/meshca:" + strings.Repeat("v", 128)},
		{name: "other repository", opts: with(func(o *options) { o.Repository = "registry.example:5000/team/meshca" }),
			wantRef: "registry.example:5000/team/meshca:v1.2.3-4-gabcdef0-dirty"},
		{name: "version with a space", opts: with(func(o *options) { o.Version = "v1 -X main.x=y" }), wantErr: "only letters, digits"},
		{name: "version with a quote", opts: with(func(o *options) { o.Version = `v1"` }), wantErr: "only letters, digits"},
		{name: "epoch not a number", opts: with(func(o *options) { o.Epoch = "yesterday" }), wantErr: "want whole seconds"},
		{name: "epoch negative", opts: with(func(o *options) { o.Epoch = "-1" }), wantErr: "want whole seconds"},
		{name: "epoch fraction", opts: with(func(o *options) { o.Epoch = "1.5" }), wantErr: "want whole seconds"},
		{name: "no arch", opts: with(func(o *options) { o.Arch = "" }), wantErr: "no GOARCH"},
		{name: "bad repository", opts: with(func(o *options) { o.Repository = "Upper/Case" }), wantErr: "image name"},
		{name: "outside a clone, no epoch", opts: with(func(o *options) { o.Root = t.TempDir(); o.Epoch = "" }),
			wantErr: "no SOURCE_DATE_EPOCH"},
		{name: "outside a clone, version dev", opts: with(func(o *options) { o.Root = t.TempDir(); o.Version = ""; o.Revision = "" }),
			wantRef: "ghcr.io/meshca/meshca:dev"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, err := resolve(context.Background(), tt.opts)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := m.Ref.String(); got != tt.wantRef {
				t.Errorf("ref %s, want %s", got, tt.wantRef)
			}
			if want := time.Unix(1700000000, 0).UTC(); !m.Created.Equal(want) || m.Created.Location() != time.UTC {
				t.Errorf("created %v, want %v", m.Created, want)
			}
		})
	}
}
