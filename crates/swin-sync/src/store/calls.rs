//! One declaration per store call. [`store_calls!`] takes a contract written once — a
//! trait of calls, each with its doc, arguments and answer — and makes from it both
//! the trait the backends implement (the compiler checks every backend against it) and
//! the method of the same name by which [`super::Store`] runs the call: dispatched to
//! the configured backend, in a span of its own under the request that made it, and
//! (tests only) failed on demand. A call marked `where ARG is empty` is not made when
//! that argument is empty (its answer is then the empty one). What an `also { }` block
//! holds goes into the trait as it is (calls that ask no store). A contract declared
//! `kept in_memory` is also implemented by the node's own memory
//! ([`super::MemoryStore`]), which refuses the calls of the others.
//!
//! So a new store call is written in three places: its line in a contract here, its
//! implementation in each backend, and the engine method that calls it through the
//! namespace's store session (timeout, breaker, stop deadline).

/// See the module's note.
macro_rules! store_calls {
    (
        $(#[$trait_meta:meta])*
        pub trait $trait:ident kept in_memory { $($body:tt)* }
    ) => {
        store_calls!(@contract [in_memory] $(#[$trait_meta])* pub trait $trait { $($body)* });
    };
    (
        $(#[$trait_meta:meta])*
        pub trait $trait:ident { $($body:tt)* }
    ) => {
        store_calls!(@contract [] $(#[$trait_meta])* pub trait $trait { $($body)* });
    };
    (
        @contract $memory:tt
        $(#[$trait_meta:meta])*
        pub trait $trait:ident {
            $(also { $($also:tt)* })?
            $(
                $(#[$meta:meta])*
                fn $name:ident(&self $(, $arg:ident : $ty:ty)* $(,)?) -> $out:ty
                    $(where $empty:ident is empty)?;
            )*
        }
    ) => {
        $(#[$trait_meta])*
        pub trait $trait: Send + Sync {
            $($($also)*)?
            $(
                $(#[$meta])*
                fn $name(&self $(, $arg: $ty)*)
                    -> impl std::future::Future<Output = Result<$out, crate::StoreError>> + Send;
            )*
        }

        impl crate::store::Store {
            $(
                $(#[$meta])*
                pub async fn $name(&self $(, $arg: $ty)*) -> Result<$out, crate::StoreError> {
                    $(
                        if $empty.is_empty() {
                            return Ok(Default::default());
                        }
                    )?
                    // boxed: callers hold one small future whatever the backend
                    let call: crate::store::BoxFuture<'_, Result<$out, crate::StoreError>> =
                        Box::pin(async move {
                        match self {
                            #[cfg(feature = "faults")]
                            crate::store::Store::Faulty(f) => {
                                let inner = f.inner();
                                f.faulted(async {
                                    store_calls!(@backend $memory inner, $name($($arg),*))
                                })
                                .await
                            }
                            store => store_calls!(@backend $memory store, $name($($arg),*)),
                        }
                    });
                    self.traced(stringify!($name), store_calls!(@namespace $($arg)*), call).await
                }
            )*
        }
    };
    // the call on the backend in `$store` (a store wrapped to fail holds a backend); a
    // contract `kept in_memory` is also the node's memory's
    (@backend [$($memory:ident)?] $store:ident, $name:ident($($arg:ident),*)) => {
        match $store {
            crate::store::Store::Postgres(s) => s.$name($($arg),*).await,
            crate::store::Store::Redis(s) => s.$name($($arg),*).await,
            crate::store::Store::Sqlite(s) => s.$name($($arg),*).await,
            crate::store::Store::Memory(s) => store_calls!(@memory [$($memory)?] s, $name($($arg),*)),
            #[cfg(feature = "faults")]
            crate::store::Store::Faulty(_) => unreachable!("a faulty store wraps a backend"),
        }
    };
    (@memory [in_memory] $s:ident, $name:ident($($arg:ident),*)) => { $s.$name($($arg),*).await };
    (@memory [] $s:ident, $name:ident($($arg:ident),*)) => {{
        let _ = ($s, $($arg),*);
        Err(crate::StoreError::Unavailable(format!(
            "{}: a node's memory keeps only leases, reservations and idempotency records",
            stringify!($name)
        )))
    }};
    // the namespace a call names, for its span: its first argument when so named
    (@namespace $first:ident $($rest:ident)*) => { store_calls!(@named $first $first) };
    (@namespace) => { None };
    (@named namespace $ns:ident) => { Some($ns) };
    (@named $other:ident $ns:ident) => { None };
}
