package local

import (
	"context"
	"strings"
	"testing"

	"github.com/managoat/managoat/sandbox"
)

// A file WriteFile puts in a jail sandbox's home (and the directories it
// makes on the way) belongs to the sandbox's workload, whose host uid is
// in the sandbox's own range: the workload appends to it and writes beside
// it.
func TestWrittenFilesBelongToTheMappedWorkload(t *testing.T) {
	p := newJail(t)
	ctx := context.Background()
	h, err := p.Create(ctx, "owner", sandbox.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.WriteFile(ctx, h, "in/deep/f", []byte("from the host\n"), sandbox.WriteFileOptions{}); err != nil {
		t.Fatal(err)
	}
	res, err := p.Exec(ctx, h, sandbox.Cmd{Name: "sh", Args: []string{"-c",
		"echo from the workload >> $HOME/in/deep/f && touch $HOME/in/deep/g $HOME/in/h && cat $HOME/in/deep/f && stat -c %u $HOME/in/deep/f && cat /proc/self/uid_map"}}, sandbox.ExecOptions{})
	if err != nil {
		t.Fatal(err)
	}
	out := string(res.Output)
	if res.ExitCode != 0 || !strings.HasPrefix(out, "from the host\nfrom the workload\n1000\n") {
		t.Fatalf("exit %d, %q", res.ExitCode, out)
	}
	t.Logf("%s", out)
}
