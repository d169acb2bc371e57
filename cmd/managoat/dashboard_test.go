package main

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/input"
	"github.com/chromedp/chromedp"

	"github.com/managoat/managoat/internal/testenv"
)

// artifactDir is where a test writes what a person looks at afterwards
// (screenshots): $MANAGOAT_ARTIFACTS/NAME if set, else a temporary
// directory of the test.
func artifactDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if a := os.Getenv("MANAGOAT_ARTIFACTS"); a != "" {
		dir = filepath.Join(a, t.Name())
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// headless starts Debian's chromium, headless, with a fresh profile,
// for the test's time.
func headless(t *testing.T) context.Context {
	t.Helper()
	path, err := exec.LookPath("chromium")
	testenv.Require(t, err == nil, "chromium (Debian package chromium) to drive the dashboard in a real browser")
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(path),
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("no-proxy-server", true), // loopback only, never an environment's proxy
		chromedp.NoFirstRun,
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1280, 1000),
	)
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(func() {
		cancel()
		cancelAlloc() // waits for the browser to exit
	})
	if err := chromedp.Do(ctx); err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	return ctx
}

// browse runs actions in the browser, bounded.
func browse(t *testing.T, ctx context.Context, what string, actions ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	tctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := chromedp.Do(tctx, actions...); err != nil {
		body, _ := chromedp.Run(ctx, chromedp.Evaluate[string](`document.body.innerText`))
		t.Fatalf("%s: %v\npage: %s", what, err, body)
	}
}

// typeIn focuses sel and inserts text as typed input (Input.insertText:
// one input event per call, as xterm.js reads it).
func typeIn(sel, text string) chromedp.Action[chromedp.Void] {
	return chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
		if _, err := chromedp.Focus(chromedp.CSS(sel))(ctx, t); err != nil {
			return err
		}
		line, enter := strings.CutSuffix(text, "\r")
		if _, err := cdp.Call(ctx, t, input.InsertText, input.InsertTextParams{Text: line}); err != nil || !enter {
			return err
		}
		_, err := chromedp.KeyEvent("\r")(ctx, t)
		return err
	})
}

// js evaluates expr in the page.
func js(expr string) chromedp.Action[chromedp.Void] {
	return chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
		_, err := chromedp.Evaluate[any](expr)(ctx, t)
		return err
	})
}

// value runs one action in the browser, bounded, and returns its value.
func value[T any](t *testing.T, ctx context.Context, what string, a chromedp.Action[T]) T {
	t.Helper()
	tctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	v, err := chromedp.Run(tctx, a)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	return v
}

// waitText polls the text of sel until it contains want.
func waitText(sel, want string) chromedp.Action[chromedp.Void] {
	return chromedp.Func(func(ctx context.Context, _ *chromedp.Target) error {
		for {
			got, err := chromedp.Run(ctx, chromedp.Evaluate[string](fmt.Sprintf(`(document.querySelector(%q)||{}).textContent||""`, sel)))
			if err != nil {
				return err
			}
			if strings.Contains(got, want) {
				return nil
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("%s never showed %q (last: %q): %w", sel, want, got, ctx.Err())
			case <-time.After(100 * time.Millisecond):
			}
		}
	})
}

// waitJS polls expr in the page until it is true.
func waitJS(expr string) chromedp.Action[chromedp.Void] {
	return chromedp.Func(func(ctx context.Context, _ *chromedp.Target) error {
		for {
			ok, err := chromedp.Run(ctx, chromedp.Evaluate[bool](expr))
			if err != nil {
				return err
			}
			if ok {
				return nil
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("%s never held: %w", expr, ctx.Err())
			case <-time.After(50 * time.Millisecond):
			}
		}
	})
}

// shot writes a screenshot of the page to dir/name.png.
func shot(t *testing.T, ctx context.Context, dir, name string) {
	t.Helper()
	browse(t, ctx, "settle", chromedp.Sleep(300*time.Millisecond))
	png := value(t, ctx, "screenshot "+name, chromedp.CaptureScreenshot())
	if err := os.WriteFile(filepath.Join(dir, name+".png"), png, 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestDashboardInABrowser drives the dashboard of a real `managoat serve`
// (the local provider on the jail) in headless Chromium: sign in with
// alice's key; a sandbox made with the CLI is listed, and one made while
// the page is open appears by itself; one created from the form exists
// for the CLI; a command typed in the browser terminal (a pty through the
// stream WebSocket) has its output on the page, and after the window
// shrinks `stty size` says the terminal's new size; a detached session's
// output is followed live (its red text rendered red, a line written
// later arriving, its exit code); a preview link of a port served by
// python3 -m http.server in the sandbox opens on its own origin; bob's
// sandbox is not_found for alice. A screenshot of each page is written
// (artifactDir). Fails on the old code: serve has no page at /.
func TestDashboardInABrowser(t *testing.T) {
	testenv.RequireRoot(t)
	_, err := os.Stat("/usr/bin/python3")
	testenv.Require(t, err == nil, "/usr/bin/python3 (Debian package python3) to serve a port inside the sandbox")
	ctx := headless(t)
	shots := artifactDir(t)
	addr := freeAddr(t)
	base := []string{"MANAGOAT_HOME=" + t.TempDir(), "SANDBOX_RUNNERS_ENABLED=false"}
	keys := map[string]string{}
	for _, who := range []string{"alice", "bob"} {
		if _, e, code := managoatEnv(t, base, "serve", "admin", "account", "create", who); code != 0 {
			t.Fatalf("account create %s: %d %s", who, code, e)
		}
		out, e, code := managoatEnv(t, base, "serve", "admin", "key", "create", who)
		if code != 0 {
			t.Fatalf("key create %s: %d %s", who, code, e)
		}
		keys[who] = strings.TrimSpace(out)
	}
	startServe(t, base, addr)
	as := func(who string) []string {
		return append(append([]string{}, base...), "MANAGOAT_URL=http://"+addr, "MANAGOAT_API_KEY="+keys[who])
	}
	alice, bob := as("alice"), as("bob")
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		_, e, code := managoatEnv(t, alice, "create", "--publish", "8000", "web")
		if code == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("create --publish 8000 web: %d %s", code, e)
		}
	}
	t.Cleanup(func() {
		for _, n := range []string{"web", "later", "fromform"} {
			managoatEnv(t, alice, "rm", "-f", n)
		}
		managoatEnv(t, bob, "rm", "-f", "bobs")
	})
	if _, e, code := managoatEnv(t, bob, "create", "bobs"); code != 0 {
		t.Fatalf("bob's create: %d %s", code, e)
	}
	site := `mkdir -p /tmp/site && echo '<h1 id=hello>hello from the sandbox</h1>' > /tmp/site/index.html && exec /usr/bin/python3 -m http.server 8000 --bind 127.0.0.1 --directory /tmp/site`
	if _, e, code := managoatEnv(t, alice, "spawn", "--detach", "web", "--", "sh", "-c", site); code != 0 {
		t.Fatalf("spawn the http.server: %d %s", code, e)
	}
	out, e, code := managoatEnv(t, alice, "spawn", "--detach", "web", "--", "sh", "-c",
		`printf '\033[31mred text\033[0m plain\n'; while [ ! -e /tmp/go-on ]; do sleep 0.1; done; echo after go-on; exit 3`)
	session := strings.TrimSpace(out)
	if code != 0 || session == "" {
		t.Fatalf("spawn the session: %d %q %s", code, out, e)
	}
	home := "http://" + addr + "/"

	// Sign in.
	browse(t, ctx, "the sign-in page", chromedp.Navigate(home), chromedp.WaitVisible(chromedp.CSS("#view-signin #key")))
	// First paint, as the browser measured it (a figure, not asserted).
	browse(t, ctx, "first paint", waitJS(`performance.getEntriesByName("first-contentful-paint").length > 0`))
	fcp := value(t, ctx, "first paint", chromedp.Evaluate[float64](`performance.getEntriesByName("first-contentful-paint")[0].startTime`))
	t.Logf("first contentful paint of / on loopback: %.1f ms (target under 200)", fcp)
	if err := os.WriteFile(filepath.Join(shots, "first-paint.txt"), fmt.Appendf(nil, "first-contentful-paint %.1f ms\n", fcp), 0o644); err != nil {
		t.Fatal(err)
	}
	shot(t, ctx, shots, "1-signin")
	browse(t, ctx, "a wrong key", chromedp.SendKeys(chromedp.CSS("#key"), "mgk_nope_nope"), chromedp.Click(chromedp.CSS("#signin-form button")),
		waitText("#error", "unauthorized"))
	browse(t, ctx, "sign in", js(`document.querySelector("#key").value = ""`), chromedp.SendKeys(chromedp.CSS("#key"), keys["alice"]),
		chromedp.Click(chromedp.CSS("#signin-form button")),
		chromedp.WaitVisible(chromedp.CSS(`#sandboxes tbody tr[data-name="web"]`)))
	cookies := value(t, ctx, "document.cookie", chromedp.Evaluate[string](`document.cookie`))
	if strings.Contains(cookies, "mgk_") {
		t.Errorf("a script reads the key: document.cookie = %q", cookies)
	}
	// A sandbox the CLI makes while the page is open appears by itself.
	if _, e, code := managoatEnv(t, alice, "create", "later"); code != 0 {
		t.Fatalf("create later: %d %s", code, e)
	}
	browse(t, ctx, "the CLI's sandbox appears", chromedp.WaitVisible(chromedp.CSS(`#sandboxes tbody tr[data-name="later"]`)))
	listed := value(t, ctx, "the list", chromedp.Text(chromedp.CSS("#sandboxes tbody")))
	if strings.Contains(listed, "bobs") || !strings.Contains(listed, "running") || !strings.Contains(listed, "local") {
		t.Errorf("alice's list: %q", listed)
	}
	shot(t, ctx, shots, "2-list")

	// Create one from the form.
	browse(t, ctx, "create from the form",
		chromedp.SendKeys(chromedp.CSS("#c-name"), "fromform"),
		chromedp.SendKeys(chromedp.CSS("#c-mem"), "256"),
		chromedp.SendKeys(chromedp.CSS("#c-pids"), "100"),
		chromedp.SendKeys(chromedp.CSS("#c-labels"), "team=ml, env=dev"),
		chromedp.Click(chromedp.CSS("#create-form button[type=submit]")),
		chromedp.WaitVisible(chromedp.CSS(`#sandboxes tbody tr[data-name="fromform"]`)),
		waitText(`#sandboxes tbody tr[data-name="fromform"]`, "256 MiB"),
		waitText(`#sandboxes tbody tr[data-name="fromform"]`, "team=ml"))
	if out, e, code := managoatEnv(t, alice, "ls", "--json"); code != 0 || !strings.Contains(out, `"team":"ml"`) {
		t.Errorf("the form's labels through the API (managoat ls --json): %d %q %s", code, out, e)
	}
	if out, e, code := managoatEnv(t, alice, "ls"); code != 0 || !strings.Contains(out, "fromform") {
		t.Fatalf("managoat ls after the form's create: %d %q %s", code, out, e)
	}
	browse(t, ctx, "filter", chromedp.SendKeys(chromedp.CSS("#filter"), "fromf"), waitText("#count", "1 of 3"))
	shot(t, ctx, shots, "3-created-filtered")

	// The sandbox's page, a terminal in it.
	browse(t, ctx, "the sandbox page", chromedp.Navigate(home+"#/sb/web"),
		chromedp.WaitVisible(chromedp.CSS(`#sessions tbody tr[data-session="`+session+`"]`)),
		chromedp.WaitVisible(chromedp.CSS(`#sb-ports button.preview[data-port="8000"]`)))
	shot(t, ctx, shots, "4-sandbox")
	browse(t, ctx, "open a terminal", chromedp.Click(chromedp.CSS("#term-form button")),
		chromedp.WaitVisible(chromedp.CSS("#terminal .xterm-rows")), waitText("#terminal .xterm-rows", "$"))
	browse(t, ctx, "type a command", typeIn("#terminal .xterm-helper-textarea", "echo $((6*7))-from-the-pty\r"),
		waitText("#terminal .xterm-rows", "42-from-the-pty"))
	browse(t, ctx, "shrink the window", chromedp.EmulateViewport(900, 700))
	browse(t, ctx, "the new size", chromedp.Sleep(500*time.Millisecond))
	size := value(t, ctx, "the new size", chromedp.AttributeValue(chromedp.CSS("#terminal"), "data-size")).Value
	browse(t, ctx, "stty size", typeIn("#terminal .xterm-helper-textarea", "clear; stty size\r"),
		waitText("#terminal .xterm-rows", size))
	shot(t, ctx, shots, "5-terminal")
	browse(t, ctx, "wide again", chromedp.EmulateViewport(1280, 1000))

	// Follow the session's output live.
	browse(t, ctx, "follow the session", chromedp.Navigate(home+"#/sb/web/session/"+session),
		waitText("#ss-output .xterm-rows", "red text plain"))
	red := value(t, ctx, "the red text", chromedp.Evaluate[string](`[...document.querySelectorAll("#ss-output .xterm-fg-1")].map(e => e.textContent).join("")`))
	if !strings.Contains(red, "red text") || strings.Contains(red, "plain") {
		t.Errorf("the text in red (xterm-fg-1) = %q, want only \"red text\"", red)
	}
	if _, e, code := managoatEnv(t, alice, "exec", "web", "--", "touch", "/tmp/go-on"); code != 0 {
		t.Fatalf("exec touch: %d %s", code, e)
	}
	browse(t, ctx, "the later line and the exit", waitText("#ss-output .xterm-rows", "after go-on"), waitText("#ss-status", "exited with code 3"))
	shot(t, ctx, shots, "6-session")

	// A session followed while its socket is killed three times from the
	// page: the page reconnects with the offset it has, and its terminal
	// holds the whole output, each line once.
	const lines = 400
	out, e, code = managoatEnv(t, alice, "spawn", "--detach", "web", "--", "sh", "-c",
		fmt.Sprintf(`i=1; while [ $i -le %d ]; do echo "line $i"; [ $((i %% 10)) = 0 ] && sleep 0.05; i=$((i+1)); done; exit 5`, lines))
	long := strings.TrimSpace(out)
	if code != 0 || long == "" {
		t.Fatalf("spawn the long session: %d %q %s", code, out, e)
	}
	browse(t, ctx, "follow the long session", chromedp.Navigate(home+"#/sb/web/session/"+long), waitText("#ss-status", "following"))
	for kill := 1; kill <= 3; kill++ {
		at := value(t, ctx, "the offset", chromedp.Evaluate[int](`Number(document.querySelector("#ss-output").dataset.offset)`))
		browse(t, ctx, "more output", waitJS(fmt.Sprintf(`Number(document.querySelector("#ss-output").dataset.offset) > %d`, at+300)))
		browse(t, ctx, "kill the socket", js(`document.querySelector("#ss-output").socket.close()`),
			waitJS(fmt.Sprintf(`Number(document.querySelector("#ss-output").dataset.reconnects) >= %d`, kill)))
	}
	browse(t, ctx, "the long session's exit", waitText("#ss-status", "exited with code 5"))
	text := value(t, ctx, "the terminal's text", chromedp.Evaluate[string](`(() => { const b = document.querySelector("#ss-output").term.buffer.active; const out = [];
		for (let i = 0; i < b.length; i++) out.push(b.getLine(i).translateToString(true)); return out.join("\n").replace(/\n+$/, ""); })()`))
	var want strings.Builder
	for i := 1; i <= lines; i++ {
		fmt.Fprintf(&want, "line %d\n", i)
	}
	if text != strings.TrimSuffix(want.String(), "\n") {
		t.Errorf("after 3 killed sockets the page shows %d bytes, want %d:\n%s", len(text), want.Len()-1, text)
	}
	if n := value(t, ctx, "reconnects", chromedp.Evaluate[int](`Number(document.querySelector("#ss-output").dataset.reconnects)`)); n < 3 {
		t.Errorf("%d reconnects, want 3 or more", n)
	}
	shot(t, ctx, shots, "6b-session-resumed")

	// A preview link of the port python3 -m http.server serves.
	browse(t, ctx, "a preview link", chromedp.Navigate(home+"#/sb/web"),
		chromedp.WaitVisible(chromedp.CSS(`#sb-ports button.preview[data-port="8000"]`)),
		chromedp.Click(chromedp.CSS(`#sb-ports button.preview[data-port="8000"]`)),
		chromedp.WaitVisible(chromedp.CSS("#sb-ports a.preview-link")))
	link := value(t, ctx, "the link", chromedp.AttributeValue(chromedp.CSS("#sb-ports a.preview-link"), "href")).Value
	u, err := url.Parse(link)
	if err != nil || !strings.HasSuffix(u.Hostname(), ".localhost") {
		t.Fatalf("preview link %q", link)
	}
	var loc string
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		browse(t, ctx, "open the preview", chromedp.Navigate(link))
		text := value(t, ctx, "the preview's text", chromedp.Evaluate[string](`document.body.innerText`))
		loc = value(t, ctx, "the preview's location", chromedp.Location())
		if strings.Contains(text, "hello from the sandbox") {
			break
		}
		if time.Now().After(deadline) { // the server is starting meanwhile: 502
			t.Fatalf("the preview showed %q", text)
		}
		if !strings.Contains(text, "port_unreachable") && !strings.Contains(text, "hello") {
			t.Fatalf("the preview showed %q", text)
		}
		// The link is valid for its 15 minutes: open it again.
	}
	if lu, _ := url.Parse(loc); lu == nil || lu.Host != u.Host || lu.Path != "/" {
		t.Errorf("after the exchange the page is at %q, want the preview's origin at /", loc)
	}
	shot(t, ctx, shots, "7-preview")
	// managoat url --preview prints such a link too.
	cliLink, e, code := managoatEnv(t, alice, "url", "--preview", "8000", "web")
	if code != 0 || !strings.HasPrefix(strings.TrimSpace(cliLink), u.Scheme+"://"+u.Host+"/") {
		t.Fatalf("managoat url --preview 8000 web = %d %q %s, want a link on %s", code, cliLink, e, u.Host)
	}
	browse(t, ctx, "open the CLI's link", chromedp.Navigate(strings.TrimSpace(cliLink)), waitText("body", "hello from the sandbox"))

	// The sandbox page lists both links; revoking the CLI's (the newest,
	// whose cookie the browser now holds) refuses the cookie at once.
	browse(t, ctx, "the preview links", chromedp.Navigate(home+"#/sb/web"),
		chromedp.WaitVisible(chromedp.CSS(`#sb-previews tbody tr:nth-child(2)[data-state="valid"] button.revoke`)))
	shot(t, ctx, shots, "7b-preview-links")
	browse(t, ctx, "revoke the CLI's link", chromedp.Click(chromedp.CSS(`#sb-previews tbody tr:nth-child(2) button.revoke`)),
		chromedp.WaitVisible(chromedp.CSS(`#sb-previews tbody tr:nth-child(2)[data-state="revoked"]`)),
		chromedp.WaitVisible(chromedp.CSS(`#sb-previews tbody tr:nth-child(1)[data-state="valid"]`)))
	browse(t, ctx, "the revoked link's cookie", chromedp.Navigate(u.Scheme+"://"+u.Host+"/"), waitText("body", "unauthorized"))
	browse(t, ctx, "the revoked link", chromedp.Navigate(strings.TrimSpace(cliLink)), waitText("body", "unauthorized"))

	// Bob's sandbox, from alice's session.
	browse(t, ctx, "bob's sandbox", chromedp.Navigate(home+"#/sb/bobs"), waitText("#error", "not_found"))
	shot(t, ctx, shots, "8-other-account")
}
