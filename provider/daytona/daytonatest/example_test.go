package daytonatest_test

import (
	"fmt"
	"log"
	"net/http"
	"strings"

	"github.com/managoat/managoat/provider/daytona/daytonatest"
)

// A Server answers Daytona's control plane under URL (which ends in /api);
// Inject makes requests fail.
func ExampleNew() {
	srv, err := daytonatest.New()
	if err != nil {
		log.Fatal(err)
	}
	defer srv.Close()
	srv.Inject("GET", "/api/sandbox", 1, daytonatest.Fault{Status: 429, Body: `{"retryAfter":2}`})

	for range 2 {
		req, _ := http.NewRequest("GET", srv.URL+"/sandbox", nil)
		req.Header.Set("Authorization", "Bearer "+srv.APIKey)
		resp, err := srv.Client().Do(req)
		if err != nil {
			log.Fatal(err)
		}
		resp.Body.Close()
		fmt.Println(resp.StatusCode)
	}
	fmt.Println(strings.HasSuffix(srv.URL, "/api"))
	// Output:
	// 429
	// 200
	// true
}
