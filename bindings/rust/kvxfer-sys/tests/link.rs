//! Every function of the header resolves in the loaded library, and the
//! library's version is compatible with the header the bindings came from.
use kvxfer_sys as sys;
use std::ffi::CStr;

#[test]
fn every_function_links() {
    let fns: [*const (); 43] = [
        sys::kvx_version_number as *const (),
        sys::kvx_version_string as *const (),
        sys::kvx_strerror as *const (),
        sys::kvx_error_scope_of as *const (),
        sys::kvx_last_error_message as *const (),
        sys::kvx_options_create as *const (),
        sys::kvx_options_destroy as *const (),
        sys::kvx_options_set as *const (),
        sys::kvx_transport_create as *const (),
        sys::kvx_transport_close as *const (),
        sys::kvx_transport_destroy as *const (),
        sys::kvx_transport_base_addr as *const (),
        sys::kvx_transport_num_blocks as *const (),
        sys::kvx_transport_block_len as *const (),
        sys::kvx_transport_config_fingerprint as *const (),
        sys::kvx_transport_backend as *const (),
        sys::kvx_transport_backends as *const (),
        sys::kvx_get_agent_metadata as *const (),
        sys::kvx_add_remote_peer as *const (),
        sys::kvx_remove_remote_peer as *const (),
        sys::kvx_write_blocks as *const (),
        sys::kvx_poll as *const (),
        sys::kvx_poll_results as *const (),
        sys::kvx_cancel as *const (),
        sys::kvx_config_fingerprint as *const (),
        sys::kvx_peer_backend as *const (),
        sys::kvx_peer_rails as *const (),
        sys::kvx_get_peer_state as *const (),
        sys::kvx_region_alloc as *const (),
        sys::kvx_region_free as *const (),
        sys::kvx_options_parse as *const (),
        sys::kvx_backends as *const (),
        sys::kvx_add_remote_peer_async as *const (),
        sys::kvx_registration_status as *const (),
        sys::kvx_wait as *const (),
        sys::kvx_completion_fd as *const (),
        sys::kvx_get_stats as *const (),
        sys::kvx_stats_bucket_lower_ns as *const (),
        sys::kvx_list_peers as *const (),
        sys::kvx_metrics_text as *const (),
        sys::kvx_set_log_handler as *const (),
        sys::kvx_get_log_level as *const (),
        sys::kvx_log_flush as *const (),
    ];
    assert!(fns.iter().all(|f| !f.is_null()));
}

#[test]
fn runtime_version_matches_header() {
    let runtime = unsafe { sys::kvx_version_number() };
    assert_eq!(
        runtime / 10000,
        sys::KVX_VERSION_MAJOR,
        "major version differs"
    );
    assert!(
        runtime >= sys::KVX_VERSION_NUMBER,
        "library older than header"
    );
    let s = unsafe { CStr::from_ptr(sys::kvx_version_string()) };
    let expect = format!(
        "{}.{}.{}",
        runtime / 10000,
        runtime / 100 % 100,
        runtime % 100
    );
    assert_eq!(s.to_str().unwrap(), expect);
}

#[test]
fn raw_error_conventions() {
    unsafe {
        assert_eq!(sys::kvx_error_scope_of(sys::KVX_OK), sys::KVX_SCOPE_NONE);
        assert_eq!(
            sys::kvx_error_scope_of(sys::KVX_ENOENT),
            sys::KVX_SCOPE_REQUEST
        );
        assert_eq!(
            sys::kvx_error_scope_of(sys::KVX_EPEERBROKEN),
            sys::KVX_SCOPE_PEER
        );
        assert_eq!(
            sys::kvx_error_scope_of(sys::KVX_ECLOSED),
            sys::KVX_SCOPE_TRANSPORT
        );
        assert_eq!(sys::kvx_error_scope_of(-123456), sys::KVX_SCOPE_TRANSPORT);
        assert!(!sys::kvx_strerror(-123456).is_null());
        let mut fp = [0 as std::os::raw::c_char; sys::KVX_FINGERPRINT_LEN as usize + 1];
        let rc = sys::kvx_config_fingerprint(fp.as_mut_ptr(), b"[1]\0".as_ptr().cast());
        assert_eq!(rc, sys::KVX_ECONFIG);
        let msg = CStr::from_ptr(sys::kvx_last_error_message());
        assert!(!msg.to_bytes().is_empty());
        let mut opts = std::ptr::null_mut();
        assert_eq!(sys::kvx_options_create(&mut opts), 0);
        assert_eq!(
            sys::kvx_options_set(
                opts,
                b"no.such.key\0".as_ptr().cast(),
                b"1\0".as_ptr().cast()
            ),
            sys::KVX_EINVAL
        );
        sys::kvx_options_destroy(opts);
        sys::kvx_options_destroy(std::ptr::null_mut());
        sys::kvx_transport_destroy(std::ptr::null_mut());
    }
}
