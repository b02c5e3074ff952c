package crlverify

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// OpenSSL checks chain (the leaf first) against roots and the CRL file
// with `openssl verify -crl_check_all` at now, a second verifier written
// apart from this package: nil when openssl accepts the chain, else an
// error with what openssl said. The file is given to openssl as it is
// (PEM; one DER CRL is converted first), so an empty file is no CRL: then
// only the path is checked, as webpki does. dir holds the files written.
func OpenSSL(ctx context.Context, dir string, roots, chain []*x509.Certificate, crlFile []byte, now time.Time) error {
	if len(chain) == 0 {
		return fmt.Errorf("crlverify: no certificate")
	}
	write := func(name string, certs []*x509.Certificate) (string, error) {
		var b bytes.Buffer
		for _, c := range certs {
			_ = pem.Encode(&b, &pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})
		}
		p := filepath.Join(dir, name)
		return p, os.WriteFile(p, b.Bytes(), 0o600)
	}
	ca, err := write("roots.pem", roots)
	if err != nil {
		return err
	}
	leaf, err := write("leaf.pem", chain[:1])
	if err != nil {
		return err
	}
	args := []string{"verify", "-CAfile", ca, "-attime", strconv.FormatInt(now.Unix(), 10)}
	if len(chain) > 1 {
		inter, err := write("untrusted.pem", chain[1:])
		if err != nil {
			return err
		}
		args = append(args, "-untrusted", inter)
	}
	if crls := pemCRLs(crlFile); len(crls) > 0 {
		p := filepath.Join(dir, "crl.pem")
		if err := os.WriteFile(p, crls, 0o600); err != nil {
			return err
		}
		args = append(args, "-crl_check_all", "-CRLfile", p)
	}
	out, err := exec.CommandContext(ctx, "openssl", append(args, leaf)...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("openssl verify: %v: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}

// pemCRLs is file's CRLs as PEM: as it is when PEM, one DER CRL encoded.
func pemCRLs(file []byte) []byte {
	switch {
	case len(bytes.TrimSpace(file)) == 0:
		return nil
	case bytes.HasPrefix(file, []byte("-----BEGIN")):
		if !bytes.Contains(file, []byte("-----BEGIN X509 CRL-----")) {
			return nil
		}
		return file
	}
	return pem.EncodeToMemory(&pem.Block{Type: "X509 CRL", Bytes: file})
}
