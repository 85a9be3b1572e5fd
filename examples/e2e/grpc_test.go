package e2e

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	testpb "google.golang.org/grpc/interop/grpc_testing"

	"github.com/warren-tunnel/warren/tunnel"
)

// grpcService is a grpc-go TestService: unary echo (with a status or a wait on request),
// server streaming, client streaming and bidirectional echo. It records how its calls
// ended.
type grpcService struct {
	testpb.UnimplementedTestServiceServer
	// ended receives the error of each call's context once it ended early (canceled or
	// past its deadline).
	ended chan error
	// deadlines receives the deadline of each call that waits (zero: none).
	deadlines chan time.Time
}

func (s *grpcService) UnaryCall(ctx context.Context, req *testpb.SimpleRequest) (*testpb.SimpleResponse, error) {
	if st := req.GetResponseStatus(); st != nil {
		return nil, status.Error(codes.Code(st.Code), st.Message)
	}
	if string(req.GetPayload().GetBody()) == "wait" {
		dl, ok := ctx.Deadline()
		if !ok {
			dl = time.Time{}
		}
		s.deadlines <- dl
		<-ctx.Done()
		s.ended <- ctx.Err()
		return nil, status.FromContextError(ctx.Err()).Err()
	}
	md, _ := metadata.FromIncomingContext(ctx)
	_ = grpc.SetTrailer(ctx, metadata.Pairs("echo-trailer", "t-"+first(md.Get("echo"))))
	_ = grpc.SetHeader(ctx, metadata.Pairs("echo-header", "h-"+first(md.Get("echo"))))
	return &testpb.SimpleResponse{Payload: &testpb.Payload{Body: append([]byte("echo "), req.GetPayload().GetBody()...)}}, nil
}

func first(v []string) string {
	if len(v) == 0 {
		return ""
	}
	return v[0]
}

func (s *grpcService) StreamingOutputCall(req *testpb.StreamingOutputCallRequest, st grpc.ServerStreamingServer[testpb.StreamingOutputCallResponse]) error {
	for i, p := range req.GetResponseParameters() {
		body := make([]byte, p.GetSize())
		body[0] = byte(i)
		if err := st.Send(&testpb.StreamingOutputCallResponse{Payload: &testpb.Payload{Body: body}}); err != nil {
			return err
		}
	}
	return nil
}

func (s *grpcService) StreamingInputCall(st grpc.ClientStreamingServer[testpb.StreamingInputCallRequest, testpb.StreamingInputCallResponse]) error {
	var total int32
	for {
		req, err := st.Recv()
		if errors.Is(err, io.EOF) {
			return st.SendAndClose(&testpb.StreamingInputCallResponse{AggregatedPayloadSize: total})
		}
		if err != nil {
			return err
		}
		total += int32(len(req.GetPayload().GetBody()))
	}
}

func (s *grpcService) FullDuplexCall(st grpc.BidiStreamingServer[testpb.StreamingOutputCallRequest, testpb.StreamingOutputCallResponse]) error {
	for {
		req, err := st.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			// The client went away: the stream's context says so.
			<-st.Context().Done()
			s.ended <- st.Context().Err()
			return err
		}
		if err := st.Send(&testpb.StreamingOutputCallResponse{Payload: req.GetPayload()}); err != nil {
			return err
		}
	}
}

// startGRPC serves a grpcService on loopback until the test ends.
func startGRPC(t *testing.T) (*grpcService, *countingListener) {
	t.Helper()
	svc := &grpcService{ended: make(chan error, 16), deadlines: make(chan time.Time, 16)}
	l := &countingListener{Listener: listenLoopback(t)}
	s := grpc.NewServer()
	testpb.RegisterTestServiceServer(s, svc)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = s.Serve(l)
	}()
	t.Cleanup(func() {
		s.Stop()
		<-done
	})
	return svc, l
}

// grpcClient dials the edge's public address addr for the tunnel at authority, over TLS
// when tlsCfg is set and with prior-knowledge h2c otherwise.
func grpcClient(t *testing.T, addr, authority string, tlsCfg *tls.Config) testpb.TestServiceClient {
	t.Helper()
	creds := insecure.NewCredentials()
	if tlsCfg != nil {
		creds = credentials.NewTLS(tlsCfg)
	}
	cc, err := grpc.NewClient("passthrough:///"+authority,
		grpc.WithTransportCredentials(creds),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "tcp", addr)
		}))
	require.NoError(t, err)
	t.Cleanup(func() { _ = cc.Close() })
	return testpb.NewTestServiceClient(cc)
}

// verifyAs is a client TLS configuration that trusts roots' certificate for name, whatever
// name the client asks for (the test certificate does not name the tunnels' hosts).
func verifyAs(roots *x509.CertPool, name string) *tls.Config {
	return &tls.Config{
		InsecureSkipVerify: true, // verified below, as name
		VerifyPeerCertificate: func(raw [][]byte, _ [][]*x509.Certificate) error {
			leaf, err := x509.ParseCertificate(raw[0])
			if err != nil {
				return err
			}
			_, err = leaf.Verify(x509.VerifyOptions{DNSName: name, Roots: roots})
			return err
		},
	}
}

// TestGRPCThroughTunnels: grpc-go's unary, server-streaming, client-streaming and
// bidirectional calls work through an HTTP tunnel (h2c at the edge) and an HTTPS tunnel
// (h2 by ALPN) to a grpc-go server behind connectors whose backend protocol is h2c: headers,
// trailers and error statuses (trailers-only answers) come back; a deadline propagates and
// a client's cancel reaches the server's stream context. Each member's calls share one
// HTTP/2 connection to the backend. An HTTP/1.1 tunnel next to them is served as before.
func TestGRPCThroughTunnels(t *testing.T) {
	cert, pool := selfSigned(t, "edge", "edge.test")
	e := startInprocEdge(t, tunnel.ServerConfig{Public: tunnel.PublicHTTP{H2C: true}, TLSConfig: edgeTLS(cert)})
	svc, gl := startGRPC(t)
	sess := e.connect()
	for _, sp := range []tunnel.TunnelSpec{
		{Subdomain: "grpc", BackendProtocol: "h2c"},
		{Proto: tunnel.ProtoHTTPS, Subdomain: "grpcs", BackendProtocol: "h2c"},
	} {
		_, err := sess.Forward(ctxT(t), sp, gl.Addr().String())
		require.NoError(t, err)
	}
	_, err := sess.Forward(ctxT(t), tunnel.TunnelSpec{Subdomain: "web"}, plainBackend(t, "plain"))
	require.NoError(t, err)

	clients := map[string]testpb.TestServiceClient{
		"http":  grpcClient(t, e.publicAddr, "grpc."+inprocDomain, nil),
		"https": grpcClient(t, e.httpsAddr, "grpcs."+inprocDomain, verifyAs(pool, "edge.test")),
	}
	for name, c := range clients {
		t.Run(name, func(t *testing.T) { exerciseGRPC(t, c, svc) })
	}
	require.Equal(t, int64(2), gl.n.Load(), "each member's calls share one HTTP/2 connection to the backend")

	code, body := e.get("web", "/page")
	require.Equal(t, 200, code)
	require.Equal(t, "plain /page", body)
}

// The edge answers its own failures to a gRPC call as gRPC does (a trailers-only status),
// not with an HTTP error page a gRPC client cannot read: a pool with no healthy member and a
// backend that cannot be reached are UNAVAILABLE with the edge's message.
func TestGRPCCallsGetTheEdgeFailuresAsGRPCStatuses(t *testing.T) {
	e := startInprocEdge(t, tunnel.ServerConfig{LoadBalancing: tunnel.LoadBalancing{Enabled: true}, Public: tunnel.PublicHTTP{H2C: true}})
	dead := listenLoopback(t)
	deadAddr := dead.Addr().String()
	require.NoError(t, dead.Close())
	var h switchable
	h.down.Store(true)
	sess := e.connect()
	_, err := sess.Forward(ctxT(t), tunnel.TunnelSpec{Subdomain: "gone", BackendProtocol: "h2c"}, deadAddr)
	require.NoError(t, err)
	_, err = sess.Forward(ctxT(t), tunnel.TunnelSpec{Subdomain: "sick", BackendProtocol: "h2c", Health: h.spec()}, deadAddr)
	require.NoError(t, err)

	for sub, want := range map[string]string{
		"gone": "the tunnel's backend failed",
		"sick": "no healthy backend for sick." + inprocDomain,
	} {
		c := grpcClient(t, e.publicAddr, sub+"."+inprocDomain, nil)
		_, err := c.EmptyCall(ctxT(t), &testpb.Empty{})
		st := status.Convert(err)
		require.Equal(t, codes.Unavailable, st.Code(), "%s: %v", sub, err)
		require.Contains(t, st.Message(), want, sub)
		require.NotContains(t, st.Message(), "unexpected HTTP status code", sub)
	}
}

// TestEveryEdgeAnswerReachesAGRPCClientAsAStatus: the answers the edge gives by itself, not
// only a member's failure, reach grpc-go as gRPC statuses with the edge's message, never as
// "unexpected HTTP status code" with a text/plain content type: an unknown host
// (UNIMPLEMENTED, as gRPC maps a 404), a TLS passthrough tunnel's host on the edge's HTTP
// listener (421: UNAVAILABLE), an https tunnel over plain HTTP (its redirect: UNKNOWN, the
// message naming the URL), metadata over the edge's header limit (431:
// RESOURCE_EXHAUSTED, and the connection goes on).
func TestEveryEdgeAnswerReachesAGRPCClientAsAStatus(t *testing.T) {
	cert, _ := selfSigned(t, "edge", "edge.test")
	e := startInprocEdge(t, tunnel.ServerConfig{Public: tunnel.PublicHTTP{H2C: true}, TLSConfig: edgeTLS(cert)})
	_, gl := startGRPC(t)
	sess := e.connect()
	for _, sp := range []tunnel.TunnelSpec{
		{Subdomain: "grpc", BackendProtocol: "h2c"},
		{Proto: tunnel.ProtoHTTPS, Subdomain: "secure", BackendProtocol: "h2c"},
		{Proto: tunnel.ProtoTLS, Subdomain: "passthrough"},
	} {
		_, err := sess.Forward(ctxT(t), sp, gl.Addr().String())
		require.NoError(t, err)
	}

	for _, c := range []struct {
		sub  string
		code codes.Code
		msg  string
	}{
		{"nope", codes.Unimplemented, `no tunnel for host "nope.` + inprocDomain + `"`},
		{"passthrough", codes.Unavailable, "is a TLS passthrough tunnel: connect to the HTTPS port"},
		{"secure", codes.Unknown, "served over HTTPS only: https://secure." + inprocDomain},
	} {
		_, err := grpcClient(t, e.publicAddr, c.sub+"."+inprocDomain, nil).EmptyCall(ctxT(t), &testpb.Empty{})
		st := status.Convert(err)
		require.Equal(t, c.code, st.Code(), "%s: %v", c.sub, err)
		require.Contains(t, st.Message(), c.msg, c.sub)
		require.NotContains(t, st.Message(), "unexpected HTTP status code", c.sub)
	}

	client := grpcClient(t, e.publicAddr, "grpc."+inprocDomain, nil)
	big := metadata.Pairs("x-big", strings.Repeat("x", 40<<10))
	_, err := client.EmptyCall(metadata.NewOutgoingContext(ctxT(t), big), &testpb.Empty{})
	st := status.Convert(err)
	require.Equal(t, codes.ResourceExhausted, st.Code(), "%v", err)
	require.Contains(t, st.Message(), "request header fields over the limit of 32768 bytes")
	_, err = client.UnaryCall(ctxT(t), &testpb.SimpleRequest{})
	require.NoError(t, err, "the call after it, on the same connection")
}

// exerciseGRPC runs every kind of call through c to svc: unary with metadata both ways, an
// error status and an unimplemented method, server streaming past a stream window, client
// streaming, bidirectional streaming, a deadline that reaches the server, and a client
// cancel that reaches the server's stream context.
func exerciseGRPC(t *testing.T, c testpb.TestServiceClient, svc *grpcService) {
	ctx := ctxT(t)

	// Unary, with metadata both ways.
	var hdr, trl metadata.MD
	resp, err := c.UnaryCall(metadata.AppendToOutgoingContext(ctx, "echo", "x"),
		&testpb.SimpleRequest{Payload: &testpb.Payload{Body: []byte("hi")}}, grpc.Header(&hdr), grpc.Trailer(&trl))
	require.NoError(t, err)
	require.Equal(t, "echo hi", string(resp.GetPayload().GetBody()))
	require.Equal(t, []string{"h-x"}, hdr.Get("echo-header"))
	require.Equal(t, []string{"t-x"}, trl.Get("echo-trailer"))

	// An error status (a trailers-only answer) and an unimplemented method.
	_, err = c.UnaryCall(ctx, &testpb.SimpleRequest{ResponseStatus: &testpb.EchoStatus{Code: int32(codes.NotFound), Message: "no such thing"}})
	require.Equal(t, codes.NotFound, status.Code(err), "%v", err)
	require.Equal(t, "no such thing", status.Convert(err).Message())
	_, err = c.UnimplementedCall(ctx, &testpb.Empty{})
	require.Equal(t, codes.Unimplemented, status.Code(err), "%v", err)

	// Server streaming: sizes up to 100 KiB, more than one stream window.
	sizes := []int32{1, 1000, 100 << 10, 7}
	var params []*testpb.ResponseParameters
	for _, n := range sizes {
		params = append(params, &testpb.ResponseParameters{Size: n})
	}
	out, err := c.StreamingOutputCall(ctx, &testpb.StreamingOutputCallRequest{ResponseParameters: params})
	require.NoError(t, err)
	for i, n := range sizes {
		r, err := out.Recv()
		require.NoError(t, err)
		require.Len(t, r.GetPayload().GetBody(), int(n))
		require.Equal(t, byte(i), r.GetPayload().GetBody()[0])
	}
	_, err = out.Recv()
	require.ErrorIs(t, err, io.EOF)

	// Client streaming.
	in, err := c.StreamingInputCall(ctx)
	require.NoError(t, err)
	var total int32
	for i := range 20 {
		body := make([]byte, 1000*(i+1))
		total += int32(len(body))
		require.NoError(t, in.Send(&testpb.StreamingInputCallRequest{Payload: &testpb.Payload{Body: body}}))
	}
	sum, err := in.CloseAndRecv()
	require.NoError(t, err)
	require.Equal(t, total, sum.GetAggregatedPayloadSize())

	// Bidirectional: each message is answered before the next is sent.
	bidi, err := c.FullDuplexCall(ctx)
	require.NoError(t, err)
	for i := range 10 {
		msg := []byte(fmt.Sprintf("ping %d", i))
		require.NoError(t, bidi.Send(&testpb.StreamingOutputCallRequest{Payload: &testpb.Payload{Body: msg}}))
		r, err := bidi.Recv()
		require.NoError(t, err)
		require.Equal(t, msg, r.GetPayload().GetBody())
	}
	require.NoError(t, bidi.CloseSend())
	_, err = bidi.Recv()
	require.ErrorIs(t, err, io.EOF)

	// Many calls at once.
	var wg sync.WaitGroup
	errs := make(chan error, 50)
	for i := range 50 {
		wg.Go(func() {
			msg := fmt.Sprint("c", i)
			r, err := c.UnaryCall(ctx, &testpb.SimpleRequest{Payload: &testpb.Payload{Body: []byte(msg)}})
			if err == nil && string(r.GetPayload().GetBody()) != "echo "+msg {
				err = fmt.Errorf("got %q for %q", r.GetPayload().GetBody(), msg)
			}
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}

	// A deadline propagates: the server's call has it (grpc-timeout), the client
	// gets DeadlineExceeded, and the server's call ends then (at its own deadline,
	// or by the client's reset when that comes first).
	start := time.Now()
	dctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err = c.UnaryCall(dctx, &testpb.SimpleRequest{Payload: &testpb.Payload{Body: []byte("wait")}})
	cancel()
	require.Equal(t, codes.DeadlineExceeded, status.Code(err), "%v", err)
	dl := <-svc.deadlines
	require.False(t, dl.IsZero(), "the server's call has a deadline")
	require.WithinDuration(t, start.Add(300*time.Millisecond), dl, 250*time.Millisecond)
	select {
	case err := <-svc.ended:
		require.Error(t, err)
	case <-time.After(5 * time.Second):
		t.Fatal("the server's call did not end at the deadline")
	}

	// A client's cancel reaches the server's stream context.
	cctx, cancel := context.WithCancel(ctx)
	bidi, err = c.FullDuplexCall(cctx)
	require.NoError(t, err)
	require.NoError(t, bidi.Send(&testpb.StreamingOutputCallRequest{Payload: &testpb.Payload{Body: []byte("x")}}))
	_, err = bidi.Recv()
	require.NoError(t, err)
	cancel()
	select {
	case err := <-svc.ended:
		require.ErrorIs(t, err, context.Canceled)
	case <-time.After(5 * time.Second):
		t.Fatal("the client's cancel did not reach the server")
	}
	_, err = bidi.Recv()
	require.Equal(t, codes.Canceled, status.Code(err), "%v", err)
}

// TestTLSPassthroughGRPC: a grpc-go server with its own TLS certificate behind a tls
// tunnel: every kind of call, a deadline and a cancel (exerciseGRPC), all through the edge
// without it terminating TLS.
func TestTLSPassthroughGRPC(t *testing.T) {
	// The edge's own certificate names every host under its domain: the tunnel's host goes
	// to the backend all the same.
	edgeCert, _ := selfSigned(t, "edge", "*."+inprocDomain, "edge.test")
	e := startInprocEdge(t, tunnel.ServerConfig{LoadBalancing: tunnel.LoadBalancing{Enabled: true}, TLSConfig: edgeTLS(edgeCert)})
	cert, pool := selfSigned(t, "grpc backend", "grpc."+inprocDomain)
	svc := &grpcService{ended: make(chan error, 16), deadlines: make(chan time.Time, 16)}
	gs := grpc.NewServer(grpc.Creds(credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{cert}})))
	testpb.RegisterTestServiceServer(gs, svc)
	gl := listenLoopback(t)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = gs.Serve(gl)
	}()
	t.Cleanup(func() {
		gs.Stop()
		<-done
	})
	_, err := e.connect().Forward(ctxT(t), tunnel.TunnelSpec{Proto: tunnel.ProtoTLS, Subdomain: "grpc"}, gl.Addr().String())
	require.NoError(t, err)

	c := grpcClient(t, e.httpsAddr, "grpc."+inprocDomain, &tls.Config{ServerName: "grpc." + inprocDomain, RootCAs: pool})
	exerciseGRPC(t, c, svc)

	// The connection is the client's own with the backend: one more call on it works.
	resp, err := c.UnaryCall(ctxT(t), &testpb.SimpleRequest{Payload: &testpb.Payload{Body: []byte("again")}})
	require.NoError(t, err)
	require.Equal(t, "echo again", string(resp.GetPayload().GetBody()))
}
