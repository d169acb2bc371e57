package daytona_test

import (
	"context"
	"fmt"
	"log"

	"github.com/managoat/managoat/provider/daytona"
	"github.com/managoat/managoat/provider/daytona/daytonatest"
	"github.com/managoat/managoat/sandbox"
)

// New takes a Config; a self-hosted installation sets APIURL. Here it talks
// to the daytonatest fake.
func ExampleNew() {
	srv, err := daytonatest.New()
	if err != nil {
		log.Fatal(err)
	}
	defer srv.Close()

	p, err := daytona.New(daytona.Config{APIKey: srv.APIKey, APIURL: srv.URL})
	if err != nil {
		log.Fatal(err)
	}
	reg := sandbox.NewRegistry(p)
	ctx := context.Background()
	h, err := reg.Create(ctx, "daytona", "example", sandbox.CreateOptions{})
	if err != nil {
		log.Fatal(err)
	}
	defer reg.Destroy(ctx, h)

	res, err := reg.Exec(ctx, h, sandbox.Cmd{Name: "echo", Args: []string{"it's", "here"}}, sandbox.ExecOptions{})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%q exit %d\n", res.Output, res.ExitCode)
	// Output: "it's here\n" exit 0
}

// NewFromEnv reads DAYTONA_API_KEY, DAYTONA_API_URL and DAYTONA_SNAPSHOT;
// without a key it says which variable is missing.
func ExampleNewFromEnv() {
	if _, err := daytona.NewFromEnv(); err != nil {
		fmt.Println(err)
	}
}
