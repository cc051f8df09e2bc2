//! A tenant of the lab: a ServiceAccount bound to Kubernetes' own `edit` ClusterRole in its
//! namespace (roam's `roam-edit` aggregates into it), talking to the API server with its own
//! token, as a team with `edit` on a namespace would.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::{Lab, kubectl, service_account_kubeconfig, wait_until};

/// The tenant: its namespace and its kubeconfig (removed when dropped).
pub struct Tenant {
    /// Its namespace.
    pub ns: String,
    kubeconfig: PathBuf,
    kubectl: PathBuf,
}

impl Tenant {
    /// ServiceAccount `sa` of namespace `ns` (which must exist) bound to `edit` there; returns
    /// once `edit` covers roam's VMs for it (the aggregation controller adds `roam-edit`
    /// soon after roam is installed), within `timeout`.
    pub fn create(lab: &Lab, ns: &str, sa: &str, timeout: Duration) -> Tenant {
        kubectl(lab, &["-n", ns, "create", "serviceaccount", sa]);
        kubectl(
            lab,
            &[
                "-n",
                ns,
                "create",
                "rolebinding",
                &format!("{sa}-edit"),
                "--clusterrole=edit",
                &format!("--serviceaccount={ns}:{sa}"),
            ],
        );
        let t = Tenant {
            ns: ns.to_string(),
            kubeconfig: service_account_kubeconfig(lab, ns, sa),
            kubectl: PathBuf::from(lab.kubectl()),
        };
        wait_until(timeout, "edit covering roam's VMs", || {
            let (yes, out, _) = t.kubectl(&[
                "-n",
                ns,
                "auth",
                "can-i",
                "create",
                "virtualmachines.roam.dev",
            ]);
            (yes && out.trim() == "yes").then_some(())
        });
        t
    }

    /// Its kubeconfig.
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// kubectl as the tenant: (success, stdout, stderr).
    pub fn kubectl(&self, args: &[&str]) -> (bool, String, String) {
        self.kubectl_with(args, None)
    }

    /// kubectl as the tenant with `stdin` (JSON) on its input: (success, stdout, stderr).
    pub fn kubectl_with(
        &self,
        args: &[&str],
        stdin: Option<&serde_json::Value>,
    ) -> (bool, String, String) {
        use std::io::Write;
        let mut child = std::process::Command::new(&self.kubectl)
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(args)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("run kubectl");
        let mut input = child.stdin.take().expect("kubectl's stdin");
        if let Some(object) = stdin {
            input
                .write_all(object.to_string().as_bytes())
                .expect("write to kubectl");
        }
        drop(input);
        let out = child.wait_with_output().expect("kubectl's output");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// `kubectl create -f -` of `object` as the tenant: `Ok(())` or `Err(stderr)`.
    pub fn create_object(&self, object: &serde_json::Value) -> Result<(), String> {
        match self.kubectl_with(&["create", "-f", "-"], Some(object)) {
            (true, _, _) => Ok(()),
            (false, _, err) => Err(err),
        }
    }
}

impl Drop for Tenant {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.kubeconfig);
    }
}
