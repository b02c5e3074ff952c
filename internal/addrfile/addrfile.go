// Package addrfile is the file in which `meshca serve --address-file`
// reports the addresses it bound, for whoever started it with port 0 (the
// test harness, a supervisor): written once, read the same way.
package addrfile

import (
	"encoding/json"
	"fmt"
	"os"

	"github.com/meshca/meshca/internal/atomicfile"
)

// Addresses are the addresses a running meshca serves on.
type Addresses struct {
	GRPC  string `json:"grpc"`
	Admin string `json:"admin,omitempty"`
	// BundleEndpoint is the SPIFFE bundle endpoint's (HTTPS), when served.
	BundleEndpoint string `json:"bundle_endpoint,omitempty"`
}

// Write stores a at path atomically: a reader sees all of it or nothing.
func Write(path string, a Addresses) error {
	data, err := json.Marshal(a)
	if err != nil {
		return err
	}
	return atomicfile.WriteFile(path, data, 0o644)
}

// Read loads the addresses at path.
func Read(path string) (Addresses, error) {
	var a Addresses
	data, err := os.ReadFile(path)
	if err != nil {
		return a, err
	}
	if err := json.Unmarshal(data, &a); err != nil {
		return a, fmt.Errorf("addrfile: %s: %w", path, err)
	}
	return a, nil
}
