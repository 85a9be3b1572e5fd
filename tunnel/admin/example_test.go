package admin_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"

	"github.com/warren-tunnel/warren/tunnel"
	"github.com/warren-tunnel/warren/tunnel/admin"
)

// ExamplePlane_Handler builds an edge's operator plane with an admin token, serves it and
// asks it for the load-balancing groups.
func ExamplePlane_Handler() {
	srv, err := tunnel.NewServer(tunnel.ServerConfig{LoadBalancing: tunnel.LoadBalancing{Enabled: true}})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer srv.Close()
	plane, err := admin.New(srv, admin.Options{Token: "s3cret-admin-token"})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer plane.Close()
	api := httptest.NewServer(plane.Handler()) // or srv.ServeAdmin(listener, plane.Handler())
	defer api.Close()

	for _, token := range []string{"", "s3cret-admin-token"} {
		req, _ := http.NewRequest(http.MethodGet, api.URL+"/api/groups", nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			fmt.Println(err)
			return
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		fmt.Printf("%d %s", resp.StatusCode, body)
	}
	// Output:
	// 401 {"error":"missing bearer token"}
	// 200 []
}
