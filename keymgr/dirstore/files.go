package dirstore

import (
	"crypto/x509"
	"errors"
	"os"
	"slices"

	"github.com/meshca/meshca/internal/pemutil"
	"github.com/meshca/meshca/keymgr"
)

// readCerts reads the certificates of the file path, as LoadCACerts
// does: a failure is a *keymgr.FileError naming it.
func readCerts(path string) ([]*x509.Certificate, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, &keymgr.FileError{Path: path, Err: errors.Unwrap(err)}
	}
	parsed, err := pemutil.ParseCertificates(data)
	if err != nil {
		return nil, &keymgr.FileError{Path: path, Err: err}
	}
	return parsed, nil
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

func containsCert(list []*x509.Certificate, c *x509.Certificate) bool {
	return slices.ContainsFunc(list, c.Equal)
}
