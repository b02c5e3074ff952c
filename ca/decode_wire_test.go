package ca

import (
	"context"
	"net"
	"strings"
	"testing"

	authpb "github.com/meshca/meshca/proto/istio/v1/auth"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
)

// rawCodec sends bytes as they are, to put a message on the wire that
// does not decode.
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error)      { return v.([]byte), nil }
func (rawCodec) Unmarshal(data []byte, v any) error { *(v.(*[]byte)) = data; return nil }
func (rawCodec) Name() string                       { return "proto" }

// decodingService refuses what the codec could not decode, as Server does.
type decodingService struct {
	authpb.UnimplementedIstioCertificateServiceServer
	codec *requestCodec
}

func (d decodingService) CreateCertificate(_ context.Context, in *authpb.IstioCertificateRequest) (*authpb.IstioCertificateResponse, error) {
	if err := d.codec.takeError(in); err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	return &authpb.IstioCertificateResponse{CertChain: []string{in.GetCsr()}}, nil
}

// TestUndecodableRequestIsInvalidArgument: a csr field that is not UTF-8
// is the client's mistake, InvalidArgument, not grpc-go's Internal, and
// the codec forgets it once taken; a good request decodes as usual.
func TestUndecodableRequestIsInvalidArgument(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	codec := newRequestCodec()
	g := grpc.NewServer(grpc.ForceServerCodecV2(codec))
	authpb.RegisterIstioCertificateServiceServer(g, decodingService{codec: codec})
	go func() { _ = g.Serve(lis) }()
	defer g.Stop()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	msg := protowire.AppendTag(nil, 1, protowire.BytesType)
	msg = protowire.AppendBytes(msg, []byte{0x30, 0x82, 0xff, 0xfe})
	var out []byte
	err = conn.Invoke(context.Background(), "/istio.v1.auth.IstioCertificateService/CreateCertificate", msg, &out, grpc.ForceCodec(rawCodec{}))
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "invalid UTF-8") {
		t.Fatalf("undecodable request: %v, want InvalidArgument", err)
	}
	n := 0
	codec.failed.Range(func(any, any) bool { n++; return true })
	if n != 0 {
		t.Errorf("%d decoding errors kept after the handler took them", n)
	}
	good := protowire.AppendTag(nil, 1, protowire.BytesType)
	good = protowire.AppendBytes(good, []byte("csr"))
	if err := conn.Invoke(context.Background(), "/istio.v1.auth.IstioCertificateService/CreateCertificate", good, &out, grpc.ForceCodec(rawCodec{})); err != nil {
		t.Fatalf("a good request: %v", err)
	}
}
