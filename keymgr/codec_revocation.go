package keymgr

import (
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"strconv"
	"strings"
)

// The revocations, node blocks and CRLs of the state.json document
// (format 4).

type revocationDoc struct {
	// Serial is lowercase hex without leading zeros.
	Serial    string `json:"serial"`
	Issuer    string `json:"issuer,omitempty"`
	Reason    int    `json:"reason,omitempty"`
	RevokedAt string `json:"revokedAt"`
	NotAfter  string `json:"notAfter"`
	Subject   string `json:"subject,omitempty"`
	Node      string `json:"node,omitempty"`
	By        string `json:"by,omitempty"`
}

type blockDoc struct {
	Node   string `json:"node"`
	Since  string `json:"since,omitempty"`
	At     string `json:"at"`
	Reason string `json:"reason,omitempty"`
	By     string `json:"by,omitempty"`
}

// crlDoc holds a CRL as PEM; its number and times are read from it.
type crlDoc struct {
	Issuer string `json:"issuer"`
	CRL    string `json:"crl"`
}

// crlPEMType is the PEM type of a CRL (RFC 7468).
const crlPEMType = "X509 CRL"

// encodeRevocations adds s's revocations, blocks and CRLs to doc,
// refusing what DecodeState would refuse.
func encodeRevocations(s *State, doc *stateDoc) error {
	if err := s.validateRevocations(); err != nil {
		return err
	}
	for _, r := range s.Revocations {
		doc.Revocations = append(doc.Revocations, revocationDoc{
			Serial: r.Serial.Text(16), Issuer: r.Issuer, Reason: r.Reason,
			RevokedAt: formatTime(r.RevokedAt), NotAfter: formatTime(r.NotAfter),
			Subject: r.Subject, Node: r.Node, By: r.By,
		})
	}
	for _, b := range s.Blocked {
		bd := blockDoc{Node: b.Node, At: formatTime(b.At), Reason: b.Reason, By: b.By}
		if !b.Since.IsZero() {
			bd.Since = formatTime(b.Since)
		}
		doc.Blocked = append(doc.Blocked, bd)
	}
	for _, c := range s.CRLs {
		doc.CRLs = append(doc.CRLs, crlDoc{Issuer: c.Issuer, CRL: string(pem.EncodeToMemory(&pem.Block{Type: crlPEMType, Bytes: c.DER}))})
	}
	return nil
}

// decodeRevocations sets s's revocations, blocks and CRLs from doc.
func decodeRevocations(doc *stateDoc, s *State) error {
	if doc.Format < stateFormatRevocation && (doc.Revocations != nil || doc.Blocked != nil || doc.CRLs != nil) {
		return fmt.Errorf("revocations, blocked and crls are fields of format %d, not %d", stateFormatRevocation, doc.Format)
	}
	for i, rd := range doc.Revocations {
		r, err := decodeRevocation(rd)
		if err != nil {
			return fmt.Errorf("revocation %d: %w", i+1, err)
		}
		s.Revocations = append(s.Revocations, r)
	}
	for i, bd := range doc.Blocked {
		b, err := decodeBlock(bd)
		if err != nil {
			return fmt.Errorf("node block %d: %w", i+1, err)
		}
		s.Blocked = append(s.Blocked, b)
	}
	for i, cd := range doc.CRLs {
		c, err := decodeCRL(cd)
		if err != nil {
			return fmt.Errorf("CRL %d (%.16s): %w", i+1, cd.Issuer, err)
		}
		s.CRLs = append(s.CRLs, c)
	}
	if err := s.validateRevocations(); err != nil {
		return err
	}
	return nil
}

func decodeRevocation(rd revocationDoc) (Revocation, error) {
	r := Revocation{Issuer: rd.Issuer, Reason: rd.Reason, Subject: rd.Subject, Node: rd.Node, By: rd.By}
	var err error
	if r.Serial, err = parseSerial(rd.Serial); err != nil {
		return Revocation{}, err
	}
	if r.RevokedAt, err = parseTime(rd.RevokedAt); err != nil {
		return Revocation{}, fmt.Errorf("revokedAt: %w", err)
	}
	if r.NotAfter, err = parseTime(rd.NotAfter); err != nil {
		return Revocation{}, fmt.Errorf("notAfter: %w", err)
	}
	if why := revocationRule(r); why != "" {
		return Revocation{}, errors.New(why)
	}
	return r, nil
}

// parseSerial parses a serial as encodeRevocations writes it, and only
// so: one text for one number.
func parseSerial(s string) (*big.Int, error) {
	n, ok := new(big.Int).SetString(s, 16)
	if !ok || n.Text(16) != s {
		return nil, fmt.Errorf("serial %s is not lowercase hex without leading zeros", strconv.Quote(s))
	}
	return n, nil
}

func decodeBlock(bd blockDoc) (NodeBlock, error) {
	b := NodeBlock{Node: bd.Node, Reason: bd.Reason, By: bd.By}
	var err error
	if b.At, err = parseTime(bd.At); err != nil {
		return NodeBlock{}, fmt.Errorf("at: %w", err)
	}
	if bd.Since != "" {
		if b.Since, err = parseTime(bd.Since); err != nil {
			return NodeBlock{}, fmt.Errorf("since: %w", err)
		}
	}
	return b, nil
}

func decodeCRL(cd crlDoc) (CRLRecord, error) {
	block, rest := pem.Decode([]byte(cd.CRL))
	switch {
	case block == nil || block.Type != crlPEMType:
		return CRLRecord{}, fmt.Errorf("crl: not a PEM %q block", crlPEMType)
	case len(block.Headers) != 0:
		return CRLRecord{}, errors.New("crl: the PEM block has headers")
	case strings.TrimSpace(string(rest)) != "":
		return CRLRecord{}, errors.New("crl: data follows the PEM block")
	}
	c, err := NewCRLRecord(cd.Issuer, block.Bytes)
	if err != nil {
		return CRLRecord{}, fmt.Errorf("crl: %w", err)
	}
	return c, nil
}
