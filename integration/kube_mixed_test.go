package integration

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/vmshim/vmshim/config"
)

// busyboxContainer is an ordinary container of busyboxImage running the
// shell script script, never pulled.
func busyboxContainer(name, script string) corev1.Container {
	return corev1.Container{
		Name: name, Image: busyboxImage, ImagePullPolicy: corev1.PullNever,
		Command: []string{"/bin/busybox", "sh", "-c", script},
	}
}

// testMixedPod: a VM pod with an init container, two native sidecars and
// the VM, through the kubelet. The init container writes into an
// emptyDir that the guest reads; a sidecar's port and the guest's are
// both served at the pod IP to another pod; the sidecar reaches another
// pod; kubectl logs, exec (-i and -it) and debug (-it too) work on the
// ordinary containers, and debug --target on the VM is refused; a
// sidecar that exceeds its memory limit is OOM-killed and restarted
// while the VM runs on; deleting the pod leaves no runc shim.
func (k *kubeCluster) testMixedPod(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*kubeTimeout)
	defer cancel()
	importBusybox(ctx, t, criNamespace)
	always := corev1.ContainerRestartPolicyAlways
	vol := func(name, path string) []corev1.VolumeMount {
		return []corev1.VolumeMount{{Name: name, MountPath: path}}
	}

	pod := vmPod("mixed", imageKernelAgent)
	pod.Spec.Volumes = []corev1.Volume{
		{Name: "data", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
		{Name: "www", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
	}
	initC := busyboxContainer("init", "echo from-init >/data/greeting && echo VMSHIM-SIDECAR-OK >/www/index.html && echo init done")
	initC.VolumeMounts = append(vol("data", "/data"), vol("www", "/www")...)
	side := busyboxContainer("side", "exec /bin/busybox httpd -f -p 8081 -h /www")
	side.RestartPolicy, side.VolumeMounts = &always, vol("www", "/www")
	// hog grows past its limit once told to, through a file in its volume.
	hog := busyboxContainer("hog", "while [ ! -e /data/grow ]; do /bin/busybox sleep 1; done; exec /bin/busybox tail /dev/zero")
	hog.RestartPolicy, hog.VolumeMounts = &always, vol("data", "/data")
	hog.Resources.Limits = corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("32Mi")}
	pod.Spec.InitContainers = []corev1.Container{initC, side, hog}
	pod.Spec.Containers[0].VolumeMounts = vol("data", "/data")
	pod.Spec.Containers[0].ReadinessProbe = execProbe(guestServes...)
	p := k.runReadyPod(ctx, t, pod)
	ip := p.Status.PodIP

	// The guest sees what the init container wrote.
	mount := "mkdir -p /mnt/data && mount -t 9p -o trans=virtio,version=9p2000.L " + config.ShareTagPrefix + "0 /mnt/data && cat /mnt/data/greeting"
	if out, err := k.kubectlOK(ctx, "-n", kubeNamespace, "exec", "mixed", "-c", "vm", "--", "sh", "-c", mount); err != nil || out != "from-init\n" {
		t.Errorf("the volume in the guest: %q, %v", out, err)
	}
	if out, err := k.kubectlOK(ctx, "-n", kubeNamespace, "logs", "mixed", "-c", "init"); err != nil || !strings.Contains(out, "init done") {
		t.Errorf("kubectl logs -c init: %q, %v", out, err)
	}
	if out, err := k.kubectlOK(ctx, "-n", kubeNamespace, "exec", "mixed", "-c", "side", "--", "/bin/busybox", "hostname"); err != nil || strings.TrimSpace(out) != "mixed" {
		t.Errorf("kubectl exec -c side hostname: %q, %v", out, err)
	}
	out, errOut, code := k.kubectlRun(ctx, "echo VMSHIM-$((6*7))\nexit 3\n", "-n", kubeNamespace, "exec", "-i", "mixed", "-c", "side", "--", "/bin/busybox", "sh")
	if code != 3 || !strings.Contains(out, "VMSHIM-42") {
		t.Errorf("kubectl exec -i -c side: exit %d, %q, %q", code, out, errOut)
	}
	// kubectl exec -it on the sidecar: the container's shell on a
	// terminal of the client's size, its exit code kubectl's.
	tty := k.startKubectlTTY(ctx, t, 24, 81, "-n", kubeNamespace, "exec", "-it", "mixed", "-c", "side", "--", "/bin/busybox", "sh")
	tty.waitFor("# ")
	tty.typ("echo side-$((6*7)); /bin/busybox stty size\r")
	tty.waitFor("side-42")
	tty.waitFor("24 81")
	tty.typ("exit 4\r")
	tty.exit(ctx, 4)

	// Another pod reaches both servers at the pod IP; the sidecar
	// reaches it. It runs through the same RuntimeClass with no VM at
	// all: its one container is an ordinary one.
	vm := "vm"
	client := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "client", Namespace: kubeNamespace},
		Spec: corev1.PodSpec{RuntimeClassName: &vm, Containers: []corev1.Container{busyboxContainer("client",
			"/bin/busybox mkdir -p /w && echo VMSHIM-CLIENT-OK >/w/index.html && exec /bin/busybox httpd -f -p 8082 -h /w")}},
	}
	cp := k.runReadyPod(ctx, t, client)
	get := func(from, container, url string) string {
		out, err := k.kubectlOK(ctx, "-n", kubeNamespace, "exec", from, "-c", container, "--", "/bin/busybox", "wget", "-q", "-O-", url)
		if err != nil {
			t.Errorf("GET %s from %s: %v", url, from, err)
		}
		return out
	}
	if out := get("client", "client", "http://"+net.JoinHostPort(ip, "8081")+"/"); !strings.Contains(out, "VMSHIM-SIDECAR-OK") {
		t.Errorf("another pod's GET of the sidecar's port: %q", out)
	}
	if out := get("client", "client", "http://"+net.JoinHostPort(ip, "8080")+"/"); !strings.Contains(out, "VMSHIM-HTTP-OK") {
		t.Errorf("another pod's GET of the guest's port: %q", out)
	}
	if out := get("mixed", "side", "http://"+net.JoinHostPort(cp.Status.PodIP, "8082")+"/"); !strings.Contains(out, "VMSHIM-CLIENT-OK") {
		t.Errorf("the sidecar's GET of another pod: %q", out)
	}

	// kubectl debug: an ephemeral container in the pod's network reaches
	// the guest; --target of the VM container is refused in one line.
	if _, err := k.kubectlOK(ctx, "-n", kubeNamespace, "debug", "mixed", "-c", "dbg", "--image="+busyboxImage, "--image-pull-policy=Never",
		"--", "/bin/busybox", "wget", "-q", "-O-", "http://127.0.0.1:8080/"); err != nil {
		t.Errorf("kubectl debug: %v", err)
	}
	k.waitPod(ctx, t, "mixed", "with its debug container done", func(p *corev1.Pod) bool {
		for _, s := range p.Status.EphemeralContainerStatuses {
			if s.Name == "dbg" && s.State.Terminated != nil {
				return true
			}
		}
		return false
	})
	if out, err := k.kubectlOK(ctx, "-n", kubeNamespace, "logs", "mixed", "-c", "dbg"); err != nil || !strings.Contains(out, "VMSHIM-HTTP-OK") {
		t.Errorf("the debug container's GET of the guest: %q, %v", out, err)
	}
	// kubectl debug -it: a shell on a terminal, in the pod's network,
	// that reaches the guest's port at the pod IP.
	tty = k.startKubectlTTY(ctx, t, 24, 80, "-n", kubeNamespace, "debug", "-it", "mixed", "-c", "dbgtty", "--image="+busyboxImage,
		"--image-pull-policy=Never", "--", "/bin/busybox", "sh")
	// The shell's first prompt may come before kubectl attaches.
	tty.waitFor("pressing enter")
	tty.typ("/bin/busybox wget -q -O- http://" + net.JoinHostPort(ip, "8080") + "/; echo got-$((40+2))\r")
	tty.waitFor("got-42")
	if !strings.Contains(tty.screen.String(), "VMSHIM-HTTP-OK") {
		t.Errorf("kubectl debug -it: the guest's port did not answer")
	}
	tty.typ("exit\r")
	tty.exit(ctx, 0)
	if _, err := k.kubectlOK(ctx, "-n", kubeNamespace, "debug", "mixed", "-c", "dbgvm", "--target=vm", "--image="+busyboxImage,
		"--image-pull-policy=Never", "--", "/bin/busybox", "sleep", "60"); err != nil {
		t.Errorf("kubectl debug --target=vm: %v", err)
	}
	var refused string
	if err := k.poll(ctx, "the refusal of a debug container targeting the VM", 500*time.Millisecond, func() (bool, error) {
		for _, e := range k.events(ctx, "mixed") {
			if e.Type == corev1.EventTypeWarning && strings.Contains(e.Message, "cannot be shared") {
				refused = e.Message
				return true, nil
			}
		}
		return false, nil
	}); err != nil {
		t.Errorf("%v\n%s", err, k.describe("mixed", nil))
	} else if strings.Contains(refused, "\n") {
		t.Errorf("refusal %q is not one line", refused)
	}

	// The hog's memory limit: OOM-killed, restarted; the VM runs on.
	if _, err := k.kubectlOK(ctx, "-n", kubeNamespace, "exec", "mixed", "-c", "side", "--", "/bin/busybox", "true"); err != nil {
		t.Fatal(err)
	}
	if _, err := k.kubectlOK(ctx, "-n", kubeNamespace, "exec", "mixed", "-c", "hog", "--", "/bin/busybox", "touch", "/data/grow"); err != nil {
		t.Fatal(err)
	}
	p = k.waitPod(ctx, t, "mixed", "with its hog OOM-killed and restarted", func(p *corev1.Pod) bool {
		for _, s := range p.Status.InitContainerStatuses {
			if s.Name == "hog" && s.RestartCount > 0 && s.LastTerminationState.Terminated != nil {
				return s.LastTerminationState.Terminated.Reason == "OOMKilled"
			}
		}
		return false
	})
	if vs := p.Status.ContainerStatuses[0]; vs.RestartCount != 0 || vs.State.Running == nil {
		t.Errorf("the VM after its sidecar's OOM kill: restarts %d, state %+v", vs.RestartCount, vs.State)
	}

	vmID := containerID(p)
	k.deletePods(ctx, t, "mixed", "client")
	waitGone(ctx, t, "the pod's runc shim", func() bool {
		return len(processesMentioning("containerd-shim-runc-v2 -namespace "+criNamespace+" -id ")) == 0
	})
	if left := processesMentioning(vmID); len(left) != 0 {
		t.Errorf("processes of the VM left: %q", left)
	}
}
