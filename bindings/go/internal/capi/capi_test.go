package capi

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// TestGeneratedFilesUpToDate regenerates the SWIG layer from capi.i and the
// repository's include/kvxfer.h into a temporary directory and compares it
// with the committed capi.go and capi_wrap.c. Outside the repository, or
// without swig, it skips, unless KVX_REQUIRE_SWIG=1 (bindings/go/test.sh
// sets it) turns the skip into a failure.
func TestGeneratedFilesUpToDate(t *testing.T) {
	skip := func(why string) {
		if os.Getenv("KVX_REQUIRE_SWIG") == "1" {
			t.Fatal(why + " (KVX_REQUIRE_SWIG=1)")
		}
		t.Skip(why)
	}
	header := filepath.Join("..", "..", "..", "..", "include", "kvxfer.h")
	if _, err := os.Stat(header); err != nil {
		skip("include/kvxfer.h not found: not inside the kvxfer repository")
	}
	if _, err := exec.LookPath("swig"); err != nil {
		skip("swig is not installed")
	}
	if _, err := exec.LookPath("gofmt"); err != nil {
		skip("gofmt is not on PATH")
	}
	out := t.TempDir()
	cmd := exec.Command("sh", "generate.sh", out)
	if msg, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("generate.sh: %v\n%s", err, msg)
	}
	for _, name := range []string{"capi.go", "capi_wrap.c"} {
		want, err := os.ReadFile(filepath.Join(out, name))
		if err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s is stale: run bindings/go/internal/capi/generate.sh (swig %s) and commit the result",
				name, swigVersion())
		}
	}
}

func swigVersion() string {
	out, err := exec.Command("swig", "-version").Output()
	if err != nil {
		return "unknown"
	}
	for _, line := range bytes.Split(out, []byte("\n")) {
		if bytes.HasPrefix(line, []byte("SWIG Version ")) {
			return string(bytes.TrimPrefix(line, []byte("SWIG Version ")))
		}
	}
	return "unknown"
}

// TestSmoke calls a few functions straight through the generated layer.
func TestSmoke(t *testing.T) {
	if Kvx_version_number() != uint(KVX_VERSION_NUMBER) {
		t.Errorf("library %d, header %d", Kvx_version_number(), KVX_VERSION_NUMBER)
	}
	fp := make([]byte, KVX_FINGERPRINT_LEN+1)
	if rc := Kvx_config_fingerprint(fp, `{"model":"interop","layers":2}`); rc != 0 {
		t.Fatalf("rc %d: %s", rc, Kvx_last_error_message())
	}
	if got := string(fp[:KVX_FINGERPRINT_LEN]); got != "cba5ae8625a9ca0f" {
		t.Errorf("fingerprint %q", got)
	}
	if rc := Kvx_config_fingerprint(fp, ""); rc != 0 || fp[0] != 0 {
		t.Errorf("empty config (NULL): rc %d, %q", rc, fp)
	}
	if Kvx_strerror(int(KVX_ENOENT)) == "" || Kvx_error_scope_of(int(KVX_ECLOSED)) != KVX_SCOPE_TRANSPORT {
		t.Error("strerror/scope")
	}
}
