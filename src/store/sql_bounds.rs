//! The sqlx bounds of the statements both stores share, written once.
//!
//! The shared statements (`*_sql.rs`) are functions generic over the database, `DB`: SQLite
//! or Postgres. sqlx states what a database can do as bounds on other types (`i64: Encode<DB>`,
//! `&mut DB::Connection: Executor`), and Rust does not carry such bounds from a trait's
//! where-clause to the trait's users (only supertraits are), so a helper trait with a blanket
//! impl cannot stand for them: each function must state them itself. `with_sql_bounds!` adds
//! them to every function it wraps.

/// Wraps functions generic over one database `DB` (`fn name<DB>(…) -> … { … }`, `async` or
/// not) and gives each what the shared statements need of it: running on a pool or a
/// transaction, binding `i64`, `Option<i64>`, `&str` and `Option<&str>`, and reading `String`,
/// `Option<String>`, `i64` and `Vec<u8>` by column name or position. Invoked with parentheses, so rustfmt formats the
/// functions inside.
macro_rules! with_sql_bounds {
    () => {};
    ($(#[$attr:meta])* $vis:vis async fn $($rest:tt)*) => {
        $crate::store::sql_bounds::with_sql_bounds!(@fn [async] $(#[$attr])* $vis fn $($rest)*);
    };
    ($(#[$attr:meta])* $vis:vis fn $($rest:tt)*) => {
        $crate::store::sql_bounds::with_sql_bounds!(@fn [] $(#[$attr])* $vis fn $($rest)*);
    };
    (@fn [$($async:tt)?] $(#[$attr:meta])* $vis:vis fn $name:ident<$db:ident>($($params:tt)*)
        -> $ret:ty $body:block $($rest:tt)*) => {
        $(#[$attr])*
        $vis $($async)? fn $name<$db>($($params)*) -> $ret
        where
            $db: sqlx::Database,
            for<'c> &'c mut $db::Connection: sqlx::Executor<'c, Database = $db>,
            for<'q> $db::Arguments<'q>: sqlx::IntoArguments<'q, $db>,
            for<'q> i64: sqlx::Encode<'q, $db> + sqlx::Type<$db>,
            for<'q> Option<i64>: sqlx::Encode<'q, $db> + sqlx::Type<$db>,
            for<'q> &'q str: sqlx::Encode<'q, $db> + sqlx::Type<$db>,
            for<'q> Option<&'q str>: sqlx::Encode<'q, $db> + sqlx::Type<$db>,
            for<'r> Option<String>: sqlx::Decode<'r, $db> + sqlx::Type<$db>,
            for<'r> String: sqlx::Decode<'r, $db> + sqlx::Type<$db>,
            for<'r> i64: sqlx::Decode<'r, $db> + sqlx::Type<$db>,
            for<'r> Vec<u8>: sqlx::Decode<'r, $db> + sqlx::Type<$db>,
            for<'c> &'c str: sqlx::ColumnIndex<$db::Row>,
            usize: sqlx::ColumnIndex<$db::Row>,
        $body
        $crate::store::sql_bounds::with_sql_bounds!($($rest)*);
    };
}

pub(super) use with_sql_bounds;
