package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/spf13/pflag"
)

// chartKeys is the chart's table of serve's flags: the ServeConfig key of
// each and whether it is a list, for the chart to write its settings as a
// config file (serveConfig.configMap) instead of flags.
var chartKeys = filepath.Join("..", "..", "deploy", "charts", "meshca", "files", "serve-config-keys.yaml")

// serveConfigKeys renders that table from serve's flags.
func serveConfigKeys() []byte {
	var b bytes.Buffer
	b.WriteString("# serve's flags: the key of each in a ServeConfig file, and whether it is\n")
	b.WriteString("# a list (a comma-separated flag value). Written by meshca's tests:\n")
	b.WriteString("#   MESHCA_UPDATE_CHART_KEYS=1 go test ./cmd/meshca -run TestChartConfigKeys\n")
	cmd, _ := newServe()
	cmd.Flags().VisitAll(func(f *pflag.Flag) {
		if !notConfig[f.Name] {
			fmt.Fprintf(&b, "%s: {key: %s, list: %t}\n", f.Name, configKey(f.Name), isList(f))
		}
	})
	return b.Bytes()
}

// TestChartConfigKeys: the chart's table matches serve's flags, so a
// flag added or renamed cannot be written under a key meshca refuses.
func TestChartConfigKeys(t *testing.T) {
	want := serveConfigKeys()
	if os.Getenv("MESHCA_UPDATE_CHART_KEYS") != "" {
		if err := os.WriteFile(chartKeys, want, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := os.ReadFile(chartKeys)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("%s is not serve's flags; run: make manifests", chartKeys)
	}
}
