package spritestest_test

import (
	"fmt"
	"net/http"

	"github.com/managoat/managoat/provider/sprites/spritestest"
)

// Start the fake, make it answer the next sprite creation with a 503, and
// see the request recorded.
func ExampleNewServer() {
	srv := spritestest.NewServer(spritestest.Options{})
	defer srv.Close()
	srv.Inject(spritestest.Fault{Method: "POST", Path: "/v1/sprites", Times: 1, Status: http.StatusServiceUnavailable})

	req, _ := http.NewRequest("POST", srv.URL+"/v1/sprites", nil)
	req.Header.Set("Authorization", "Bearer "+srv.Token)
	req.Close = true
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		fmt.Println(err)
		return
	}
	resp.Body.Close()
	fmt.Println(resp.StatusCode, len(srv.Requests()), srv.Requests()[0].Authorized)
	// Output: 503 1 true
}
